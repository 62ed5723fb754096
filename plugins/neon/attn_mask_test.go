package neon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched/energy"
)

// TestAttentionTreeMaskVectorPaths puts the tree mask (op set v2) through the native vector
// paths of the attention kernel: trees longer than one 32-key block, grouped heads kept
// together (4 per KV head: the AVX-512 four-head dot), a prefix before q_offset, against core/ref.
// Offset and mask are constants so that the kernel-case harness can draw the float inputs.
func TestAttentionTreeMaskVectorPaths(t *testing.T) {
	ctx := context.Background()
	shapes := []struct{ tq, hq, hkv, d, dv, off int64 }{
		{5, 8, 2, 64, 64, 70}, {40, 4, 4, 128, 128, 3}, {33, 16, 4, 64, 64, 31}, {7, 2, 1, 16, 32, 0},
		{9, 8, 4, 8, 8, 70}, {12, 4, 2, 12, 20, 33}, {20, 4, 2, 8, 8, 0}, // small heads
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

// BenchmarkAttentionTree: a 16-token draft tree verified against a 4096-row f16 KV cache (32
// query heads of 128, 8 KV heads), with the tree mask and as a plain causal chunk of the same
// shape, and one decode row: what the mask costs, and that the unmasked path kept its speed.
// Each build in build/plugins runs (pick one with -bench AttentionTree/libxpu-neon-avx512);
// XPU_PLUGIN_PATH=DIR runs another build (one without the mask skips the masked case).
func BenchmarkAttentionTree(b *testing.B) {
	const hq, hkv, d, tk = 32, 8, 128, 4096
	files, _ := findPlugins()
	if len(files) == 0 {
		b.Skip("no neon build (run make plugins)")
	}
	for _, f := range files {
		for _, c := range []struct {
			name   string
			tq     int64
			masked bool
		}{{"decode", 1, false}, {"tree16-causal", 16, false}, {"tree16-mask", 16, true}} {
			b.Run(filepath.Base(f)+"/"+c.name, func(b *testing.B) {
				ctx := context.Background()
				var mask []byte
				if c.masked {
					mask = make([]byte, c.tq*c.tq)
					for i := int64(0); i < c.tq; i++ { // a binary tree: parent (i-1)/2
						for a := i; ; a = (a - 1) / 2 {
							mask[i*c.tq+a] = 1
							if a == 0 {
								break
							}
						}
					}
				}
				ex := cacheAttention(b, f, "2", c.tq, hq, hkv, d, tk, tk-c.tq, mask)
				b.ResetTimer()
				cpu0 := processCPU()
				for range b.N {
					if err := ex.Run(ctx); err != nil {
						b.Fatal(err)
					}
				}
				// CPU time as well as wall: on a shared, loaded machine it is the steadier figure
				b.ReportMetric((processCPU()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}

// cacheAttention is attentionExecution of a causal attention of tq query rows (f32, hq heads
// of d) over an f16 cache of tk rows (hkv heads) at q_offset off, with a tree mask (tq x tq)
// where mask is not nil.
func cacheAttention(b *testing.B, f, threads string, tq, hq, hkv, d, tk, off int64, mask []byte) core.Execution {
	b.Helper()
	g := core.NewGraph()
	q := g.Input("q", core.F32, tq, hq, d)
	k := g.Input("k", core.F16, tk, hkv, d)
	v := g.Input("v", core.F16, tk, hkv, d)
	o := core.AttentionOptions{Causal: true,
		QOffsetInput: g.Const("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{int32(off)}))}
	if mask != nil {
		o.Mask = g.Const("mask", core.I8, core.Shape{tq, tq}, mask)
	}
	g.Output(g.Attention(q, k, v, o))
	if err := g.Err(); err != nil {
		b.Fatal(err)
	}
	return attentionExecution(b, f, g, threads, q, k, v)
}

// attentionExecution prepares g (inputs ins, then one output) on the plugin file f with the
// given threads and binds it to buffers: F16 inputs hold normal draws, F32 inputs uniform ones
// in [-1, 1), the output zeros. It skips the benchmark when the file does not open here or its
// build refuses g; what it opens is closed when the benchmark ends.
func attentionExecution(b *testing.B, f string, g *core.Graph, threads string, ins ...*core.Tensor) core.Execution {
	b.Helper()
	ctx := context.Background()
	be, err := loader.Open(ctx, f)
	if err != nil {
		b.Skipf("%s: %v", f, err)
	}
	b.Cleanup(func() { be.Close() })
	cctx, err := be.Devices()[0].NewContext(ctx, map[string]string{"threads": threads})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cctx.Close() })
	exe, err := cctx.Prepare(ctx, g)
	if errors.Is(err, core.ErrUnsupported) {
		b.Skipf("this build refuses it: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { exe.Close() })
	ex, err := exe.NewExecution()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ex.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	for io, t := range append(ins, g.Outputs[0]) {
		buf, err := cctx.Alloc(t.Bytes(), core.BufferDevice)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { buf.Close() })
		data := make([]byte, t.Bytes())
		switch {
		case io == len(ins):
		case t.DType == core.F16:
			for i := 0; i+1 < len(data); i += 2 {
				h := core.F32ToF16(float32(rng.NormFloat64()))
				data[i], data[i+1] = byte(h), byte(h>>8)
			}
		default:
			copy(data, core.EncodeF32(randF32(rng, t.Shape.NumElements())))
		}
		if err := buf.Write(0, data); err != nil {
			b.Fatal(err)
		}
		if err := ex.Bind(io, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
	return ex
}

// BenchmarkAttentionDecode: one decode row of a 1B Llama (32 query heads of 64, 8 KV heads) with
// the cache warm and cold: an f32 cache of 4096 rows of which 196 are visible on one thread, and
// an f16 cache at depth 4096 (every row visible) on one and two threads, where decode at depth spends
// its attention time. Cold reads 256 MiB of other memory between runs, outside the timer, as a
// decode step's weight stream evicts the cache between one layer's tokens. Each build in
// build/plugins runs; XPU_PLUGIN_PATH=a.so:b.so compares two builds (for example main's and a
// branch's avx2).
func BenchmarkAttentionDecode(b *testing.B) {
	const hq, hkv, d, tk = 32, 8, 64, 4096
	files, _ := findPlugins()
	if len(files) == 0 {
		b.Skip("no neon build (run make plugins)")
	}
	junk := make([]byte, 256<<20)
	for i := range junk {
		junk[i] = byte(i)
	}
	for _, c := range []struct {
		name    string
		dt      core.DType
		off     int32
		threads string
	}{{"f32-d196-t1", core.F32, 195, "1"}, {"f16-d4096-t1", core.F16, tk - 1, "1"}, {"f16-d4096-t2", core.F16, tk - 1, "2"}} {
		for i, f := range files {
			for _, cold := range []bool{false, true} {
				name := fmt.Sprintf("%s/%d-%s/warm", c.name, i, filepath.Base(f))
				if cold {
					name = fmt.Sprintf("%s/%d-%s/cold", c.name, i, filepath.Base(f))
				}
				b.Run(name, func(b *testing.B) {
					ctx := context.Background()
					g := core.NewGraph()
					q := g.Input("q", core.F32, 1, hq, d)
					k := g.Input("k", c.dt, tk, hkv, d)
					v := g.Input("v", c.dt, tk, hkv, d)
					g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true,
						QOffsetInput: g.Const("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{c.off}))}))
					if err := g.Err(); err != nil {
						b.Fatal(err)
					}
					ex := attentionExecution(b, f, g, c.threads, q, k, v)
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
}

// BenchmarkAttentionSmallHead is attention at stories260K's shapes, the small-head path (8 query
// heads of 8 over 4 KV heads, an f16 cache of 1024 rows, 480 keys before the rows, 1 thread):
// a decode row, a causal verify chunk of 4 and of 8 rows, and 8 rows as a draft tree (each
// node sees its parent's line). This is what a verify pass of speculative decoding adds per
// row, the most of its cost on a model this small. Builds are compared through
// XPU_PLUGIN_PATH=old.so:new.so, the cases interleaved by -count.
func BenchmarkAttentionSmallHead(b *testing.B) {
	const hq, hkv, d, tk, off = 8, 4, 8, 1024, 480
	files, _ := findPlugins()
	if len(files) == 0 {
		b.Skip("no neon build (run make plugins)")
	}
	for _, c := range []struct {
		name   string
		tq     int64
		masked bool
	}{{"decode", 1, false}, {"verify4", 4, false}, {"verify8", 8, false}, {"tree8", 8, true}} {
		for i, f := range files {
			b.Run(fmt.Sprintf("%s/%d-%s", c.name, i, filepath.Base(f)), func(b *testing.B) {
				ctx := context.Background()
				var mask []byte
				if c.masked {
					mask = make([]byte, c.tq*c.tq)
					for i := int64(0); i < c.tq; i++ { // two chains from the root: 0-2-4-6 and 1-3-5-7
						for a := i; a >= 0; a -= 2 {
							mask[i*c.tq+a] = 1
						}
					}
				}
				ex := cacheAttention(b, f, "1", c.tq, hq, hkv, d, tk, off, mask)
				b.ResetTimer()
				for range b.N {
					if err := ex.Run(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// processCPU is the user+system CPU time of this process so far (the plugin's threads included).
func processCPU() time.Duration {
	t, _ := energy.ProcessCPUTime() // 0 where the platform does not say
	return t
}

// TestAttentionSmallHeadMaskedNaN: the small-head path (head sizes that are not multiples of
// 16) loads a whole 32-key window for all the rows of a task and gives a masked key a weight of
// exactly 0; a masked key whose K and V rows are NaN (a sibling branch of a draft tree) must
// still not reach the rows that do not see it, while the rows that do see it get NaN, as
// core/ref says. Keys after the prefix sit in the window the prefix ends in and in the next.
func TestAttentionSmallHeadMaskedNaN(t *testing.T) {
	ctx := context.Background()
	const tq, hq, hkv = 6, 4, 2
	parents := []int64{-1, 0, 1, 1, 3, 4} // nodes 2 and 3 are siblings: 3, 4, 5 never see 2
	mask := make([]byte, tq*tq)
	for i := range parents {
		for a := int64(i); a >= 0; a = parents[a] {
			mask[int64(i)*tq+a] = 1
		}
	}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, kv := range []core.DType{core.F32, core.F16} {
			for _, s := range []struct{ d, dv, off int64 }{{8, 8, 29}, {8, 12, 60}, {12, 8, 3}} {
				tol := 1e-5
				if kv == core.F16 {
					tol = 2e-3
				}
				kc := kernelCase{
					name: fmt.Sprintf("small_head_nan_d%d_dv%d_off%d_%s", s.d, s.dv, s.off, kv),
					tol:  tol,
					build: func(g *core.Graph, rng *rand.Rand) {
						tk := s.off + tq
						rows := func(dim int64) []byte {
							x := randF32(rng, tk*hkv*dim)
							for i := int64(0); i < hkv*dim; i++ {
								x[(s.off+2)*hkv*dim+i] = float32(math.NaN())
							}
							if kv == core.F32 {
								return core.EncodeF32(x)
							}
							b := make([]byte, 2*len(x))
							for i, v := range x {
								binary.LittleEndian.PutUint16(b[2*i:], core.F32ToF16(v))
							}
							return b
						}
						q := g.Input("q", core.F32, tq, hq, s.d)
						k := g.Const("k", kv, core.Shape{tk, hkv, s.d}, rows(s.d))
						v := g.Const("v", kv, core.Shape{tk, hkv, s.dv}, rows(s.dv))
						off := g.Const("q_offset", core.I32, core.Shape{1}, core.EncodeI32([]int32{int32(s.off)}))
						m := g.Const("mask", core.I8, core.Shape{tq, tq}, mask)
						g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffsetInput: off, Mask: m}))
					},
				}
				runKernelCase(t, ctx, dev, filepath.Base(f)+"/"+kc.name, kc, map[string]string{"threads": "1"})
			}
		}
	}
}
