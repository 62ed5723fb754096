package neon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/xpuhub/xpu/core"
)

// TestAttentionVectorPaths aims at the native x86 vectors of the attention kernel (head sizes
// that are multiples of 8 and 16, over several 32-key blocks, both KV dtypes): decode-shaped
// (one query row, grouped heads) and a short chunk, against core/ref.
func TestAttentionVectorPaths(t *testing.T) {
	ctx := context.Background()
	shapes := []struct{ tq, hq, hkv, d, dv, tk int64 }{
		{1, 8, 2, 64, 64, 75}, {1, 4, 4, 128, 128, 40}, {3, 4, 2, 80, 48, 70}, {2, 2, 1, 16, 32, 33},
		{1, 16, 4, 64, 64, 75}, {1, 32, 8, 128, 128, 50}, // 4 query heads per KV head, kept together
		// small heads (stories260K's 8; 8x8 and 4x4 transposes and single elements; the
		// two-pass AVX2 path up to 16 values, the one-pass one above)
		{5, 8, 4, 8, 8, 100}, {3, 4, 2, 12, 12, 70}, {2, 4, 4, 4, 4, 40}, {1, 2, 1, 20, 16, 65}, {4, 2, 1, 8, 24, 90},
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
					name: fmt.Sprintf("attention_%dx%dx%d_kv%dx%dx%d_%s", s.tq, s.hq, s.d, s.tk, s.hkv, s.dv, kv),
					tol:  tol,
					build: func(g *core.Graph, _ *rand.Rand) {
						q := g.Input("q", core.F32, s.tq, s.hq, s.d)
						k := g.Input("k", kv, s.tk, s.hkv, s.d)
						v := g.Input("v", kv, s.tk, s.hkv, s.dv)
						g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: s.tk - s.tq}))
					},
				}
				runKernelCase(t, ctx, dev, filepath.Base(f)+"/"+kc.name, kc, map[string]string{"threads": "2"})
			}
		}
	}
}
