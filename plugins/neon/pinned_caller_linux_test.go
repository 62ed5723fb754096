package neon_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// runOnThread runs the graph once on a context with opts, from a goroutine locked to its OS
// thread and pinned to pin (nil: the thread's mask is left alone), and returns the outputs and
// the calling thread's CPU time over the run's wall time. (Not over the process's CPU time: a
// worker that spins from its creation through the run is not context-switched, and getrusage
// leaves out the slice it is in, so that share put ~all the time on the caller in a quarter
// of the floating runs and the test failed about once in 50; this one separates them, 100
// runs each: floating 0.04-0.16, pinned 0.98-1.00.)
func runOnThread(t *testing.T, dev core.Device, g *core.Graph, in [][]byte, opts map[string]string, pin []int) ([][]byte, float64) {
	t.Helper()
	type result struct {
		out   [][]byte
		share float64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: a re-pinned thread ends with the goroutine
		r := result{}
		defer func() { done <- r }()
		// a floating caller gets every CPU of the process's mask explicitly: a new OS thread
		// inherits the mask of the thread that made it, and Go may make it from the thread of
		// an earlier pinned run (then the "floating" caller was pinned to CPU 0, ran the graph
		// itself, and the test failed now and then)
		set := floatingMask
		if pin != nil {
			set = unix.CPUSet{}
			for _, c := range pin {
				set.Set(c)
			}
		}
		if r.err = unix.SchedSetaffinity(0, &set); r.err != nil {
			return
		}

		ctx := context.Background()
		c, err := dev.NewContext(ctx, opts)
		if r.err = err; err != nil {
			return
		}
		defer c.Close()
		exe, err := c.Prepare(ctx, g)
		if r.err = err; err != nil {
			return
		}
		defer exe.Close()
		x, err := exe.NewExecution()
		if r.err = err; err != nil {
			return
		}
		defer x.Close()
		var outs []core.Buffer
		for i, tt := range append(append([]*core.Tensor{}, g.Inputs...), g.Outputs...) {
			b, err := c.Alloc(tt.Bytes(), core.BufferHostVisible)
			if r.err = err; err != nil {
				return
			}
			defer b.Close()
			if i < len(g.Inputs) {
				if r.err = b.Write(0, in[i]); r.err != nil {
					return
				}
			} else {
				outs = append(outs, b)
			}
			if r.err = x.Bind(i, b, 0); r.err != nil {
				return
			}
		}
		thread0, start := threadCPU(), time.Now()
		if r.err = x.Run(ctx); r.err != nil {
			return
		}
		r.share = float64(threadCPU()-thread0) / float64(time.Since(start))
		for i, b := range outs {
			data := make([]byte, g.Outputs[i].Bytes())
			if r.err = b.Read(0, data); r.err != nil {
				return
			}
			r.out = append(r.out, data)
		}
	}()
	r := <-done
	require.NoError(t, r.err)
	return r.out, r.share
}

// floatingMask is the CPUs a floating caller of runOnThread may use: the mask the process
// started with, read at package initialization, before any test pins a thread.
var floatingMask = func() unix.CPUSet {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		for c := range runtime.NumCPU() {
			set.Set(c)
		}
	}
	return set
}()

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// TestPinnedCallerRunsInline: a one-thread context pinned to CPU 0, called from a thread
// pinned to CPU 0 too (as xpu's runtime pins a unit's worker), runs the graph on the calling
// thread (it, not the pool's thread, spends the CPU time) and gives the results the pool's
// thread gives a floating caller, within the kernels' tolerance of core/ref.
func TestPinnedCallerRunsInline(t *testing.T) {
	var mask unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &mask))
	if !mask.IsSet(0) || mask.Count() < 2 {
		t.Skip("needs CPU 0 and another CPU in the test's mask")
	}
	ctx := context.Background()
	opts := map[string]string{"cpus": "0", "threads": "1"}
	files := pluginFiles(t)
	if raceEnabled {
		files = files[:1] // the Go side is what -race checks; the C path is the same for every build
	}
	for _, f := range files {
		dev := openUsable(t, f).Devices()[0]
		t.Run(filepath.Base(f), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 7))
			g := core.NewGraph()
			// a block of a decode step, big enough (~25 MFLOP per run) for CPU times to tell the
			// thread that computed it
			x := g.Input("x", core.F32, 2, 1024)
			h := g.RMSNorm(x, 1e-5)
			up := g.MatMul(h, constOf(g, rng, "wu", core.Q4_0, 2048, 1024))
			gate := g.MatMul(h, constOf(g, rng, "wg", core.Q8_0, 2048, 1024))
			down := g.MatMul(g.Mul(g.SiLU(gate), up), constOf(g, rng, "wd", core.F32, 1024, 2048))
			g.Output(g.Add(x, down))
			require.NoError(t, g.Err())
			in := inputsFor(g, rng)
			want, err := ref.Run(ctx, g, in)
			require.NoError(t, err)

			// CPU shares are timing: on a loaded machine the pool's pinned thread may not get
			// core 0 in time and the caller helps, so each side gets three tries and keeps its
			// clearest (the property is what the plugin does when it can, not under starvation).
			var floating, pinned [][]byte
			floatShare, pinShare := 2.0, -1.0
			for try := 0; try < 3 && (floatShare >= 0.5 || pinShare <= 0.5); try++ {
				f, fs := runOnThread(t, dev, g, in, opts, nil)
				p, ps := runOnThread(t, dev, g, in, opts, []int{0})
				floating, pinned = f, p
				floatShare, pinShare = min(floatShare, fs), max(pinShare, ps)
			}
			require.Equal(t, floating, pinned, "the same kernels on another thread")
			gv, wv := decodeAny(core.F32, pinned[0]), decodeAny(core.F32, want[0])
			worst, at, peak := maxError(gv, wv)
			require.LessOrEqual(t, worst/peak, 5e-2, "max error %g at %d, peak %g", worst, at, peak)
			t.Logf("share of the CPU time on the calling thread: pinned %.2f, floating %.2f", pinShare, floatShare)
			require.Greater(t, pinShare, 0.5, "a pinned caller computes the graph itself")
			require.Less(t, floatShare, 0.5, "a floating caller hands the graph to the pool's pinned thread")
		})
	}
}
