package neon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
)

// BenchmarkAttentionDecode: one decode row of a 1B Llama (32 query heads of 64, 8 KV heads, an
// f32 cache of 4096 rows of which 196 are visible) on one thread, with the cache warm and cold.
// Cold reads 64 MiB of other memory between runs, outside the timer, as a decode step's weight
// stream evicts the cache between one layer's tokens. Each build in build/plugins runs;
// XPU_PLUGIN_PATH=a.so:b.so compares two builds (for example main's and a branch's avx2).
func BenchmarkAttentionDecode(b *testing.B) {
	const hq, hkv, d, tk, off = 32, 8, 64, 4096, 195
	files, _ := findPlugins()
	if len(files) == 0 {
		b.Skip("no neon build (run make plugins)")
	}
	junk := make([]byte, 64<<20)
	for i := range junk {
		junk[i] = byte(i)
	}
	for i, f := range files {
		for _, cold := range []bool{false, true} {
			name := fmt.Sprintf("%d-%s/warm", i, filepath.Base(f))
			if cold {
				name = fmt.Sprintf("%d-%s/cold", i, filepath.Base(f))
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				g := core.NewGraph()
				q := g.Input("q", core.F32, 1, hq, d)
				k := g.Input("k", core.F32, tk, hkv, d)
				v := g.Input("v", core.F32, tk, hkv, d)
				g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true,
					QOffsetInput: g.Const("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{off}))}))
				if err := g.Err(); err != nil {
					b.Fatal(err)
				}
				be, err := loader.Open(ctx, f)
				if err != nil {
					b.Skipf("%s: %v", f, err)
				}
				defer be.Close()
				cctx, err := be.Devices()[0].NewContext(ctx, map[string]string{"threads": "1"})
				if err != nil {
					b.Fatal(err)
				}
				defer cctx.Close()
				exe, err := cctx.Prepare(ctx, g)
				if err != nil {
					b.Fatal(err)
				}
				defer exe.Close()
				ex, err := exe.NewExecution()
				if err != nil {
					b.Fatal(err)
				}
				defer ex.Close()
				rng := rand.New(rand.NewPCG(1, 2))
				for io, t := range []*core.Tensor{q, k, v, g.Outputs[0]} {
					buf, err := cctx.Alloc(t.Bytes(), core.BufferDevice)
					if err != nil {
						b.Fatal(err)
					}
					defer buf.Close()
					if err := buf.Write(0, core.EncodeF32(randF32(rng, t.Shape.NumElements()))); err != nil {
						b.Fatal(err)
					}
					if err := ex.Bind(io, buf, 0); err != nil {
						b.Fatal(err)
					}
				}
				var sink byte
				b.ResetTimer()
				for range b.N {
					if cold {
						b.StopTimer()
						for i := 0; i < len(junk); i += 64 {
							sink += junk[i]
						}
						b.StartTimer()
					}
					if err := ex.Run(ctx); err != nil {
						b.Fatal(err)
					}
				}
				junk[0] = sink
			})
		}
	}
}
