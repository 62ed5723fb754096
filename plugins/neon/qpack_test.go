package neon_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// qpackShapes cover the edges of the repacked layout (k_qpack.c): N below, at and past one
// group of 16 rows and not a multiple of it, M on both sides of the decode path (M <= 4, every
// thread quantizes its own activations) and of the prefill tile of 4 rows, K of one block.
var qpackShapes = []struct{ m, n, k int64 }{
	{1, 1, 32}, {1, 17, 64}, {2, 16, 96}, {3, 45, 256}, {4, 33, 64}, {5, 31, 128}, {13, 45, 256}, {37, 50, 320},
}

// TestRepackedMatMul runs the repacked kernels of every build (VNNI, AVX2, generic through
// int8dot=0, one and two threads) against core/ref.
func TestRepackedMatMul(t *testing.T) {
	ctx := context.Background()
	ctxOpts := []map[string]string{{"threads": "2"}, {"threads": "2", "int8dot": "0"}, {"threads": "1"}}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, opts := range ctxOpts {
			for _, dt := range []core.DType{core.Q4_0, core.Q8_0} {
				for _, s := range qpackShapes {
					name := fmt.Sprintf("%s/threads=%s/int8dot=%s", filepath.Base(f), opts["threads"], opts["int8dot"])
					runKernelCase(t, ctx, dev, name+"/repacked", matmulCase(s.m, s.n, s.k, dt, 2e-2), opts)
				}
			}
		}
	}
}

// TestRepackedMatchesUnpacked: the repacked and the GGUF-layout kernels compute the same int8
// block dot products, so they agree to float rounding; a misplaced byte of the layout would
// show far above it.
func TestRepackedMatchesUnpacked(t *testing.T) {
	ctx := context.Background()
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, dt := range []core.DType{core.Q4_0, core.Q8_0} {
			for _, s := range qpackShapes {
				t.Run(fmt.Sprintf("%s/%s/%dx%dx%d", filepath.Base(f), dt, s.m, s.n, s.k), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.n), 3))
					g := core.NewGraph()
					a := g.Input("a", core.F32, s.m, s.k)
					g.Output(g.MatMul(a, constOf(g, rng, "w", dt, s.n, s.k)))
					require.NoError(t, g.Err())
					in := inputsFor(g, rng)
					var outs [2][]float32
					for i, repack := range []string{"1", "0"} {
						sess, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(),
							sched.WithContextOptions(map[string]string{"threads": "2", "repack": repack}))
						require.NoError(t, err)
						got, err := sess.Run(ctx, in)
						require.NoError(t, err)
						require.NoError(t, sess.Close())
						outs[i] = core.DecodeF32(got[0])
					}
					require.Len(t, outs[0], int(s.m*s.n))
					scale := 1.0
					for _, v := range outs[1] {
						scale = math.Max(scale, math.Abs(float64(v)))
					}
					for i := range outs[0] {
						require.InDelta(t, outs[1][i], outs[0][i], 1e-5*scale, "element %d", i)
					}
				})
			}
		}
	}
}

// logCapture collects the messages logged through slog while it is installed.
type logCapture struct {
	mu   sync.Mutex
	msgs []string
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, r.Message)
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// captureLogs installs a logCapture as slog's default until the test ends.
func captureLogs(t *testing.T) *logCapture {
	c := &logCapture{}
	old := slog.Default()
	slog.SetDefault(slog.New(c))
	t.Cleanup(func() { slog.SetDefault(old) })
	return c
}

func (c *logCapture) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// TestRepackedWeightShared: two executables of one context over the same constant share one
// repacked copy (the plugin logs each repack at debug level, with its size), the survivor runs
// correctly after the other is released, and a new context repacks again.
func TestRepackedWeightShared(t *testing.T) {
	ctx := context.Background()
	capture := captureLogs(t)

	rng := rand.New(rand.NewPCG(5, 6))
	const n, k = 40, 96
	wdata, err := core.Quantize(core.Q4_0, randF32(rng, n*k), 1.0/64)
	require.NoError(t, err)
	const repacked = "repacked a 40x96 q4_0 weight: 2592 bytes" // 3 groups x 3 blocks x 288 B
	graph := func(m int64) *core.Graph {
		g := core.NewGraph()
		a := g.Input("a", core.F32, m, k)
		g.Output(g.MatMul(a, g.Const("w", core.Q4_0, core.Shape{n, k}, wdata)))
		require.NoError(t, g.Err())
		return g
	}
	for _, f := range pluginFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			dev := openUsable(t, f).Devices()[0]
			cctx, err := dev.NewContext(ctx, map[string]string{"threads": "2"})
			require.NoError(t, err)
			var closers []func() error
			defer func() {
				for i := len(closers) - 1; i >= 0; i-- {
					_ = closers[i]()
				}
				require.NoError(t, cctx.Close())
			}()
			before := capture.count(repacked)
			g1, g5 := graph(1), graph(5)
			exe1, err := cctx.Prepare(ctx, g1)
			require.NoError(t, err)
			exe5, err := cctx.Prepare(ctx, g5)
			require.NoError(t, err)
			closers = append(closers, exe5.Close)
			require.Equal(t, 1, capture.count(repacked)-before, "two executables over one weight must share one repacked copy")
			require.NoError(t, exe1.Close())

			in := inputsFor(g5, rng)
			want, err := ref.Run(ctx, g5, in)
			require.NoError(t, err)
			ex, err := exe5.NewExecution()
			require.NoError(t, err)
			closers = append(closers, ex.Close)
			ib, err := cctx.Alloc(int64(len(in[0])), core.BufferDevice)
			require.NoError(t, err)
			closers = append(closers, ib.Close)
			ob, err := cctx.Alloc(int64(len(want[0])), core.BufferDevice)
			require.NoError(t, err)
			closers = append(closers, ob.Close)
			require.NoError(t, ib.Write(0, in[0]))
			require.NoError(t, ex.Bind(0, ib, 0))
			require.NoError(t, ex.Bind(1, ob, 0))
			require.NoError(t, ex.Run(ctx))
			got := make([]byte, len(want[0]))
			require.NoError(t, ob.Read(0, got))
			gv, wv := core.DecodeF32(got), core.DecodeF32(want[0])
			scale := 1.0 // the tolerance of the kernel cases: relative to the largest output
			for _, v := range wv {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			for i := range wv {
				require.InDelta(t, wv[i], gv[i], 2e-2*scale, "element %d", i)
			}
			for i := len(closers) - 1; i >= 0; i-- {
				require.NoError(t, closers[i]())
			}
			closers = nil

			// the last user released it: preparing again repacks
			exe, err := cctx.Prepare(ctx, g1)
			require.NoError(t, err)
			closers = append(closers, exe.Close)
			require.Equal(t, 2, capture.count(repacked)-before)
		})
	}
}

// kqpackShapes are qpackShapes for the K-quants (K a multiple of 256): N around and past a
// group of 16 rows, M on both sides of the decode path and of the 4-row prefill tile.
var kqpackShapes = []struct{ m, n, k int64 }{
	{1, 1, 256}, {1, 17, 512}, {2, 16, 256}, {3, 45, 768}, {4, 33, 256}, {5, 31, 512}, {13, 45, 256}, {37, 50, 512},
}

var kqRepacked = []core.DType{core.Q4_K, core.Q5_K, core.Q6_K}

// TestRepackedKQuantMatMul runs the K-quant kernels of every build (VNNI, AVX2, generic through
// int8dot=0 on the portable build, one and two threads) against core/ref, and Q2_K/Q3_K (no
// repacked kernel: f32 paths) with them.
func TestRepackedKQuantMatMul(t *testing.T) {
	ctx := context.Background()
	ctxOpts := []map[string]string{{"threads": "2"}, {"threads": "2", "int8dot": "0"}, {"threads": "1"}}
	dts := append(kqRepacked, core.Q2_K, core.Q3_K)
	if testing.Short() { // make test: the int8 kernels of every build, in half the time
		ctxOpts, dts = ctxOpts[:2], kqRepacked
	}
	for _, f := range pluginFiles(t) {
		dev := openUsable(t, f).Devices()[0]
		for _, opts := range ctxOpts {
			for _, dt := range dts {
				for _, s := range kqpackShapes {
					name := fmt.Sprintf("%s/threads=%s/int8dot=%s", filepath.Base(f), opts["threads"], opts["int8dot"])
					kc := matmulCase(s.m, s.n, s.k, dt, 2e-2)
					runKernelCase(t, ctx, dev, name+"/"+kc.name, kc, opts)
				}
			}
		}
	}
}

// TestKQuantKernelsAgree: every K-quant kernel (each build's, and the baseline one under
// int8dot=0) reads the same repacked bytes with the same quantized activations, so all of them
// agree with the first one run to float rounding (the plain C kernel is among them: the portable
// build, and int8dot=0 on aarch64 without dotprod); a misplaced bit of the
// layout (a plane, a scale, a min) would show far above it, though the 2 % tolerance against
// the reference might let it through.
func TestKQuantKernelsAgree(t *testing.T) {
	ctx := context.Background()
	files := pluginFiles(t)
	for _, dt := range kqRepacked {
		for _, s := range kqpackShapes {
			t.Run(fmt.Sprintf("%s/%dx%dx%d", dt, s.m, s.n, s.k), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(s.n), 9))
				g := core.NewGraph()
				a := g.Input("a", core.F32, s.m, s.k)
				g.Output(g.MatMul(a, constOf(g, rng, "w", dt, s.n, s.k)))
				require.NoError(t, g.Err())
				in := inputsFor(g, rng)
				var base []float32
				var baseName string
				for _, f := range files {
					dev := openUsable(t, f).Devices()[0]
					for _, int8dot := range []string{"1", "0"} {
						sess, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(),
							sched.WithContextOptions(map[string]string{"threads": "2", "int8dot": int8dot}))
						require.NoError(t, err)
						got, err := sess.Run(ctx, in)
						require.NoError(t, err)
						require.NoError(t, sess.Close())
						out := core.DecodeF32(got[0])
						name := filepath.Base(f) + "/int8dot=" + int8dot
						if base == nil {
							base, baseName = out, name
							continue
						}
						scale := 1.0
						for _, v := range base {
							scale = math.Max(scale, math.Abs(float64(v)))
						}
						for i := range out {
							require.InDelta(t, base[i], out[i], 1e-5*scale, "%s vs %s: element %d", name, baseName, i)
						}
					}
				}
			})
		}
	}
}

// TestRepackedWeightViews: a weight whose rows, from a whole group of 16 on, lie inside a
// repacked copy the context holds runs out of that copy (a split whose cut moves between
// prepared cut points holds one copy per unit, not one per cut); a range not starting at a
// group is packed on its own. Every range matches core/ref, also after the executable of the
// whole weight is released (a view holds its copy).
func TestRepackedWeightViews(t *testing.T) {
	ctx := context.Background()
	capture := captureLogs(t)

	rng := rand.New(rand.NewPCG(7, 8))
	const n, m = 80, 3
	cases := []struct {
		dt core.DType
		k  int64
	}{{core.Q4_0, 96}, {core.Q8_0, 64}, {core.Q4_K, 256}}
	for _, f := range pluginFiles(t) {
		for _, c := range cases {
			t.Run(filepath.Base(f)+"/"+c.dt.String(), func(t *testing.T) {
				wdata, err := core.Quantize(c.dt, randF32(rng, n*c.k), 1.0/64)
				require.NoError(t, err)
				row := c.dt.Bytes(c.k)
				graph := func(r0, r1 int64) *core.Graph {
					g := core.NewGraph()
					a := g.Input("a", core.F32, m, c.k)
					g.Output(g.MatMul(a, g.Const("w", c.dt, core.Shape{r1 - r0, c.k}, wdata[r0*row:r1*row])))
					require.NoError(t, g.Err())
					return g
				}
				dev := openUsable(t, f).Devices()[0]
				cctx, err := dev.NewContext(ctx, map[string]string{"threads": "2"})
				require.NoError(t, err)
				defer func() { require.NoError(t, cctx.Close()) }()
				views, repacks := capture.count("is a view of a cached"), capture.count("neon: repacked a")
				whole, err := cctx.Prepare(ctx, graph(0, n))
				require.NoError(t, err)
				ranges := [][2]int64{{16, 80}, {32, 45}, {0, 7}, {8, 40}}
				exes := map[[2]int64]core.Executable{}
				for _, r := range ranges {
					exes[r], err = cctx.Prepare(ctx, graph(r[0], r[1]))
					require.NoError(t, err)
					defer func() { require.NoError(t, exes[r].Close()) }()
				}
				require.Equal(t, 3, capture.count("is a view of a cached")-views, "rows from a whole group on are views")
				require.Equal(t, 2, capture.count("neon: repacked a")-repacks, "the whole weight and rows 8:40")
				require.NoError(t, whole.Close())
				for _, r := range ranges {
					g := graph(r[0], r[1])
					in := inputsFor(g, rng)
					want, err := ref.Run(ctx, g, in)
					require.NoError(t, err)
					got := runExecutable(t, cctx, exes[r], in, int64(len(want[0])))
					worst, at, peak := maxError(decodeAny(core.F32, got), decodeAny(core.F32, want[0]))
					require.LessOrEqual(t, worst/peak, 2e-2, "rows %d:%d: max error %g at %d", r[0], r[1], worst, at)
				}
			})
		}
	}
}

// runExecutable runs exe, one input and one output, in a new execution of cctx's buffers and
// returns the output's bytes.
func runExecutable(t *testing.T, cctx core.Context, exe core.Executable, in [][]byte, outBytes int64) []byte {
	ctx := context.Background()
	ex, err := exe.NewExecution()
	require.NoError(t, err)
	defer func() { require.NoError(t, ex.Close()) }()
	ib, err := cctx.Alloc(int64(len(in[0])), core.BufferDevice)
	require.NoError(t, err)
	defer func() { require.NoError(t, ib.Close()) }()
	ob, err := cctx.Alloc(outBytes, core.BufferDevice)
	require.NoError(t, err)
	defer func() { require.NoError(t, ob.Close()) }()
	require.NoError(t, ib.Write(0, in[0]))
	require.NoError(t, ex.Bind(0, ib, 0))
	require.NoError(t, ex.Bind(1, ob, 0))
	require.NoError(t, ex.Run(ctx))
	got := make([]byte, outBytes)
	require.NoError(t, ob.Read(0, got))
	return got
}
