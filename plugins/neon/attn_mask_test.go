package neon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/xpuhub/xpu/core"
)

// TestAttentionTreeMaskVectorPaths puts the tree mask (op set v2) through the native vector
// paths of the attention kernel: trees longer than one 32-key block, grouped heads kept
// together (4 per KV head: the AVX-512 four-head dot), a prefix before q_offset, against core/ref.
// Offset and mask are constants so that the kernel-case harness can draw the float inputs.
func TestAttentionTreeMaskVectorPaths(t *testing.T) {
	ctx := context.Background()
	shapes := []struct{ tq, hq, hkv, d, dv, off int64 }{
		{5, 8, 2, 64, 64, 70}, {40, 4, 4, 128, 128, 3}, {33, 16, 4, 64, 64, 31}, {7, 2, 1, 16, 32, 0},
	}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, kv := range []core.DType{core.F32, core.F16} {
			for _, s := range shapes {
				tol := 1e-5
				if kv == core.F16 {
					tol = 2e-3
				}
				kc := kernelCase{
					name: fmt.Sprintf("masked_attention_%dx%dx%d_kv%dx%d_off%d_%s", s.tq, s.hq, s.d, s.hkv, s.dv, s.off, kv),
					tol:  tol,
					build: func(g *core.Graph, rng *rand.Rand) {
						tk := s.off + s.tq
						mask := make([]byte, s.tq*s.tq)
						parents := make([]int64, s.tq)
						for i := range parents {
							parents[i] = int64(rng.IntN(i+1)) - 1
							for a := int64(i); a >= 0; a = parents[a] {
								mask[int64(i)*s.tq+a] = 1
							}
						}
						q := g.Input("q", core.F32, s.tq, s.hq, s.d)
						k := g.Input("k", kv, tk, s.hkv, s.d)
						v := g.Input("v", kv, tk, s.hkv, s.dv)
						off := g.Const("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{int32(s.off)}))
						m := g.Const("mask", core.I8, core.Shape{s.tq, s.tq}, mask)
						g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffsetInput: off, Mask: m}))
					},
				}
				runKernelCase(t, ctx, dev, filepath.Base(f)+"/"+kc.name, kc, map[string]string{"threads": "2"})
			}
		}
	}
}
