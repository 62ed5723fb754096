package sparse

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
)

// O_DIRECT is used where the filesystem allows it (the test's temporary directory may or may
// not); buffered reads give the same bytes either way (TestRuntimeCacheContents).
func TestRuntimeDirectIO(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	want := true
	if df, err := openDirect(f.path); err != nil {
		want = false
		t.Logf("no direct I/O here (%v): checking the fallback", err)
	} else {
		require.NoError(t, df.Close())
	}
	r, _ := f.open(t, f.path, WithPredictor(setPred{sets: [][]int32{{1, 200, 201, 300}}}))
	now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
	wait, err := r.Select(context.Background(), 1, tokens(f.sc.D, 0), nil, nil, now, later)
	require.NoError(t, err)
	require.NoError(t, wait())
	st := r.Stats()
	assert.Equal(t, want, st.DirectIO)
	if want {
		assert.Zero(t, st.BytesRead%ioAlign, "direct reads are whole pages")
	}
	rb, _ := f.open(t, f.path, WithBufferedIO())
	assert.False(t, rb.Stats().DirectIO)
}

// A sidecar shorter than its header says fails at NewRuntime; one truncated after Load fails the
// wait of the first read past its end, naming the file, layer and offset, and the rows that
// failed are not taken for cached afterwards.
func TestRuntimeTruncated(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	full, err := os.ReadFile(f.path)
	require.NoError(t, err)
	cut := filepath.Join(t.TempDir(), "cut.sparse.gguf")
	end := f.sc.BundleOffset(1) + 300*f.rb
	require.NoError(t, os.WriteFile(cut, full[:end], 0o644))
	_, err = NewRuntime(context.Background(), f.m, f.sc, cut, WithContext(rtCtx, core.F32))
	require.ErrorIs(t, err, ErrFormat)
	require.ErrorContains(t, err, cut)

	for _, tc := range []struct {
		name     string
		buffered bool
		end      int64
	}{
		{"direct", false, end},
		{"direct/mid-row", false, f.sc.BundleOffset(1) + 350*f.rb + 100}, // ends inside row 350
		{"buffered", true, end},
		{"buffered/mid-row", true, f.sc.BundleOffset(1) + 350*f.rb + 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.sparse.gguf")
			require.NoError(t, os.WriteFile(path, full, 0o644))
			opts := []RuntimeOption{WithPredictor(setPred{sets: [][]int32{{1, 20, 350}}})}
			if tc.buffered {
				opts = append(opts, WithBufferedIO())
			}
			r, cache := f.open(t, path, opts...)
			require.NoError(t, os.Truncate(path, tc.end))
			now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
			ctx := context.Background()
			wait, err := r.Select(ctx, 1, tokens(f.sc.D, 0), nil, nil, now, later)
			require.NoError(t, err)
			err = wait()
			require.ErrorIs(t, err, ErrFormat)
			require.ErrorContains(t, err, path)
			require.ErrorContains(t, err, "layer 1")
			require.ErrorContains(t, err, "offset")
			require.ErrorContains(t, err, "truncated")

			// Restored, the same selection reads the rows again.
			require.NoError(t, os.WriteFile(path, full, 0o644))
			wait, err = r.Select(ctx, 1, tokens(f.sc.D, 0), nil, nil, now, later)
			require.NoError(t, err)
			require.NoError(t, wait())
			checkCache(t, f, r, cache, 1, now, later, []int32{1, 20, 350})
		})
	}
}

// The default (trained) mode gives the runner every layer's predictor and thresholds the logits
// it computes; a chunk selects the union of its tokens' neurons.
func TestRuntimeTrainedLayout(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	r, cache := f.open(t, f.path)
	lay := r.Layout()
	c := f.m.Config
	require.Len(t, lay.Predictors, c.Layers)
	for _, p := range lay.Predictors {
		assert.Equal(t, 4, p.Rank)
		assert.Len(t, p.A, 2*4*c.Dim)
		assert.Len(t, p.B, 2*c.FFN*4)
		assert.Len(t, p.Bias, 4*c.FFN)
	}
	assert.Equal(t, core.F32, lay.DType)
	assert.Equal(t, int64(3*c.Dim), lay.RowLen)
	assert.Equal(t, c.FFN, lay.Neurons)
	assert.Equal(t, core.SparseReLU, lay.Act)
	assert.False(t, lay.Ungated)

	tr := f.sc.Predictor()
	rng := rand.New(rand.NewPCG(3, 4))
	h := make([]float32, 3*c.Dim)
	for i := range h {
		h[i] = float32(rng.NormFloat64())
	}
	var logits []float32
	var want []int32
	for tk := range 3 {
		lg := tr.Logits(1, h[tk*c.Dim:(tk+1)*c.Dim], nil)
		logits = append(logits, lg...)
		want = union(want, tr.Predict(1, h[tk*c.Dim:(tk+1)*c.Dim], nil))
	}
	require.NotEmpty(t, want)
	now, later := make([]int32, c.FFN), make([]int32, c.FFN)
	for _, lg := range [][]float32{logits, nil} { // nil: the runtime computes them itself
		wait, err := r.Select(context.Background(), 1, h, lg, nil, now, later)
		require.NoError(t, err)
		require.NoError(t, wait())
		checkCache(t, f, r, cache, 1, now, later, want)
	}
}

// Recall sampling against the oracle: the oracle's prediction is the truth (recall and
// precision 1); the trained predictor's figures are what a direct count gives.
func TestRuntimeRecallSampling(t *testing.T) {
	f := newRTFixture(t, core.F16, []int{8, 8}, 1000, 1<<20)
	c := f.m.Config
	or, err := NewOracle(f.sc, 0)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(8, 9))
	hs := make([][]float32, 6)
	for i := range hs {
		hs[i] = make([]float32, 2*c.Dim)
		for j := range hs[i] {
			hs[i][j] = float32(rng.NormFloat64())
		}
	}
	tr := f.sc.Predictor()
	var tp, pred, truth int64
	for i, h := range hs {
		if i%2 != 0 {
			continue // sampled: every 2nd Select
		}
		for tk := range 2 {
			x := h[tk*c.Dim : (tk+1)*c.Dim]
			on := map[int32]bool{}
			for _, n := range or.Predict(i%c.Layers, x, nil) {
				on[n] = true
			}
			p := tr.Predict(i%c.Layers, x, nil)
			pred += int64(len(p))
			truth += int64(len(on))
			for _, n := range p {
				if on[n] {
					tp++
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		opt  RuntimeOption
		tp   int64
		pr   int64
		tr   int64
	}{
		{"oracle", WithPredictor(or), -1, -1, -1},
		{"trained", WithRecallSampling(2), tp, pred, truth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := f.open(t, f.path, tc.opt, WithRecallSampling(2))
			now, later := make([]int32, c.FFN), make([]int32, c.FFN)
			for i, h := range hs {
				wait, err := r.Select(context.Background(), i%c.Layers, h, nil, nil, now, later)
				require.NoError(t, err)
				require.NoError(t, wait())
			}
			st := r.Stats()
			assert.Equal(t, int64(6), st.RecallSamples, "3 sampled Selects of 2 tokens")
			if tc.tp < 0 {
				assert.Equal(t, 1.0, st.Recall)
				assert.Equal(t, 1.0, st.Precision)
				return
			}
			assert.InDelta(t, float64(tc.tp)/float64(tc.tr), st.Recall, 1e-12)
			assert.InDelta(t, float64(tc.tp)/float64(tc.pr), st.Precision, 1e-12)
			assert.Contains(t, st.String(), "recall")
		})
	}
}

// Selects and waits hammered while other goroutines read Stats and another runtime over the
// same sidecar runs alongside (run with -race).
func TestRuntimeConcurrent(t *testing.T) {
	f := newRTFixture(t, core.Q8_0, []int{4, 4}, 8+384, 1<<20)
	sets := [][]int32{{4, 5, 6, 100}, {7, 300, 301}, {50, 60, 70, 80, 90}, {383}}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	var readers, hammers sync.WaitGroup
	for range 2 {
		r, cache := f.open(t, f.path, WithPredictor(setPred{sets}))
		readers.Add(1)
		go func() {
			defer readers.Done()
			for stop.Err() == nil {
				_ = r.Stats().String()
			}
		}()
		hammers.Add(1)
		go func() {
			defer hammers.Done()
			now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
			for i := range 300 {
				l := i % 2
				wait, err := r.Select(context.Background(), l, tokens(f.sc.D, i%4, (i/4)%4), nil, nil, now, later)
				if !assert.NoError(t, err) {
					return
				}
				if !assert.NoError(t, wait()) {
					return
				}
				if i%50 == 0 {
					bundle := f.sc.Bundle(l)
					for _, row := range later {
						if row < 0 {
							break
						}
						k := r.rowAt(l, int64(row))
						assert.Equal(t, bundle[int64(k)*f.rb:][:f.rb], cache[int64(row)*f.rb:][:f.rb])
					}
				}
			}
		}()
	}
	hammers.Wait()
	cancel()
	readers.Wait()
}

// A cancelled context fails the reads in flight; the runtime goes on working afterwards.
func TestRuntimeCancel(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{0, 0}, 768, 1<<20)
	r, cache := f.open(t, f.path, WithPredictor(setPred{[][]int32{{1, 2, 3}}}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
	wait, err := r.Select(ctx, 0, tokens(f.sc.D, 0), nil, nil, now, later)
	require.NoError(t, err)
	require.ErrorIs(t, wait(), context.Canceled)
	wait, err = r.Select(context.Background(), 0, tokens(f.sc.D, 0), nil, nil, now, later)
	require.NoError(t, err)
	require.NoError(t, wait())
	assert.Equal(t, 3, listed(later), "the cancelled rows were not cached")
	checkCache(t, f, r, cache, 0, now, later, []int32{1, 2, 3})
}

func TestRuntimeErrors(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	ctx := context.Background()
	F, D := f.sc.F, f.sc.D
	for _, tc := range []struct {
		name string
		opts []RuntimeOption
		is   error
		says string
	}{
		{"budget below the fixed region", []RuntimeOption{WithBudget(f.fx.Total() / 2)}, core.ErrInvalidArgument, "too small: fixed region needs"},
		{"negative budget", []RuntimeOption{WithBudget(-1)}, core.ErrInvalidArgument, "budget -1"},
		{"no context", []RuntimeOption{WithContext(0, core.F32)}, core.ErrInvalidArgument, "context 0"},
		{"policy", []RuntimeOption{WithEviction(Eviction(9))}, core.ErrInvalidArgument, "eviction policy 9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRuntime(ctx, f.m, f.sc, f.path, append([]RuntimeOption{WithContext(rtCtx, core.F32)}, tc.opts...)...)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.says)
		})
	}
	_, err := NewRuntime(ctx, f.m, f.sc, filepath.Join(t.TempDir(), "none"), WithContext(rtCtx, core.F32))
	require.ErrorIs(t, err, os.ErrNotExist)

	r, err := NewRuntime(ctx, f.m, f.sc, f.path, WithContext(rtCtx, core.F32), WithPredictor(setPred{[][]int32{{1}, {-1}}}))
	require.NoError(t, err)
	now, later := make([]int32, F), make([]int32, F)
	h := tokens(D, 0)
	_, err = r.Select(ctx, 0, h, nil, nil, now, later)
	require.ErrorContains(t, err, "before Load")
	require.ErrorContains(t, r.Load(ctx, make([]byte, 10)), "cache of 10 bytes")
	require.NoError(t, r.Load(ctx, make([]byte, r.Layout().Rows*f.rb)))
	for _, c := range []struct {
		name          string
		l             int
		h, logits     []float32
		now, later    []int32
		says          string
		isInvalidArgs bool
	}{
		{"layer", 2, h, nil, now, later, "layer 2 of 2", true},
		{"ragged h", 0, h[:D-1], nil, now, later, "127 values of h", true},
		{"short lists", 0, h, nil, now[:5], later, "5/384 index slots", true},
		{"logits", 0, h, make([]float32, 3), now, later, "3 logits", true},
		{"predictor out of range", 0, tokens(D, 1), nil, now, later, "neuron -1", true},
	} {
		_, err := r.Select(ctx, c.l, c.h, c.logits, nil, c.now, c.later)
		require.ErrorIs(t, err, core.ErrInvalidArgument, c.name)
		require.ErrorContains(t, err, c.says, c.name)
	}
	wait, err := r.Select(ctx, 0, h, nil, nil, now, later)
	require.NoError(t, err)
	require.NoError(t, wait())
	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "Close is idempotent")
	_, err = r.Select(ctx, 0, h, nil, nil, now, later)
	require.ErrorContains(t, err, "after Close")
}

func TestRuntimeLoadProgress(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{30, 20}, 1000, 1<<20)
	var calls [][2]int64
	r, cache := f.open(t, f.path, withIO(0, 8<<10), WithLoadProgress(func(done, total int64) {
		calls = append(calls, [2]int64{done, total})
	}))
	require.NotEmpty(t, calls)
	last := calls[len(calls)-1]
	assert.Equal(t, 50*f.rb, last[1])
	assert.Equal(t, last[1], last[0])
	for i := 1; i < len(calls); i++ {
		assert.Greater(t, calls[i][0], calls[i-1][0])
	}
	assert.Greater(t, len(calls), 2, "an 8 KiB buffer reads in several steps")
	for l, h := range []int{30, 20} {
		assert.Equal(t, f.sc.Bundle(l)[:int64(h)*f.rb], cache[r.hotBase[l]*f.rb:][:int64(h)*f.rb])
	}
}

// Decode's Selects allocate nothing once the runtime runs (without the look-ahead, whose
// queued requests still allocate a few objects per layer: issue 18's note).
func TestRuntimeSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	f := newRTFixture(t, core.F32, []int{8, 8}, 8+384, 1<<20)
	r, _ := f.open(t, f.path, WithPrefetch(false))
	c := f.m.Config
	tr := f.sc.Predictor()
	rng := rand.New(rand.NewPCG(1, 1))
	var hs, lgs [][]float32
	for range 8 {
		h := make([]float32, c.Dim)
		for i := range h {
			h[i] = float32(rng.NormFloat64())
		}
		hs = append(hs, h)
		lgs = append(lgs, tr.Logits(0, h, nil))
	}
	now, later := make([]int32, c.FFN), make([]int32, c.FFN)
	ctx := context.Background()
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		wait, err := r.Select(ctx, 0, hs[i%8], lgs[i%8], nil, now, later)
		if err == nil {
			err = wait()
		}
		if err != nil {
			panic(err)
		}
		i++
	})
	assert.Zero(t, allocs)
	assert.Positive(t, r.Stats().ColdMisses)
}

var _ io.Closer = (*Runtime)(nil)

// The look-ahead: a one-token Select of layer 0 queues the reads of layer 1's predicted neurons
// (from the same h); layer 1's Select then finds them cached (listed in now once loaded, in
// later while loading) and reads nothing more. Without it, layer 1 reads them itself.
func TestRuntimePrefetch(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	c := f.m.Config
	tr := f.sc.Predictor()
	rng := rand.New(rand.NewPCG(9, 9))
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			r, cache := f.open(t, f.path, WithPrefetch(on))
			now, later := make([]int32, c.FFN), make([]int32, c.FFN)
			var prefetched, used int64
			for step := range 6 {
				h := make([]float32, c.Dim)
				for i := range h {
					h[i] = float32(rng.NormFloat64())
				}
				for l := range 2 {
					before := r.Stats()
					wait, err := r.Select(context.Background(), l, h, tr.Logits(l, h, nil), nil, now, later)
					require.NoError(t, err)
					require.NoError(t, wait())
					checkCache(t, f, r, cache, l, now, later, tr.Predict(l, h, nil))
					st := r.Stats()
					if on && l == 1 {
						assert.Zero(t, st.ColdMisses-before.ColdMisses, "step %d: layer 1's neurons were all prefetched", step)
					}
					prefetched, used = st.PrefetchRows, st.PrefetchUsed
				}
			}
			if on {
				assert.Positive(t, prefetched)
				assert.Equal(t, prefetched, used, "the same h: every prefetched row is used")
			} else {
				assert.Zero(t, prefetched)
			}
		})
	}
}

// vmLocked is the process's locked memory (VmLck of /proc/self/status), in bytes; -1 where the
// system does not report it.
func vmLocked(t *testing.T) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmLck:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	return -1
}

// WithPinnedFixed locks every non-FFN tensor of the mapping and the sidecar's predictors while
// the runtime is open, or,
// where the system refuses, says why and runs unpinned; Close unlocks.
func TestRuntimePinnedFixed(t *testing.T) {
	f := newRTFixture(t, core.Q8_0, []int{8, 8}, 16, 0)
	var want int64
	for i := range f.m.File.Tensors {
		if tn := &f.m.File.Tensors[i]; !isFFNWeight(tn.Name) {
			want += tn.Size
		}
	}
	for _, ly := range f.sc.layers { // the predictors the graphs read from the sidecar's mapping
		want += int64(len(ly.predA) + len(ly.predB))
	}
	before := vmLocked(t)
	r, err := NewRuntime(context.Background(), f.m, f.sc, f.path, WithContext(rtCtx, core.F32), WithReaders(1), WithPinnedFixed(true))
	require.NoError(t, err)
	st := r.Stats()
	if st.PinError != "" {
		assert.Zero(t, st.PinnedBytes)
		assert.Contains(t, st.String(), "not pinned")
		t.Logf("pinning refused here: %s", st.PinError)
	} else {
		assert.Equal(t, want, st.PinnedBytes)
		assert.Contains(t, st.String(), "pinned in memory")
		if before >= 0 {
			assert.GreaterOrEqual(t, vmLocked(t)-before, want, "VmLck grows by at least the pinned tensors")
		}
	}
	require.NoError(t, r.Close())
	if before >= 0 {
		assert.Equal(t, before, vmLocked(t), "Close unlocks")
	}
	// Not asked for: nothing pinned, nothing said.
	r, err = NewRuntime(context.Background(), f.m, f.sc, f.path, WithContext(rtCtx, core.F32), WithReaders(1))
	require.NoError(t, err)
	assert.Zero(t, r.Stats().PinnedBytes)
	assert.Empty(t, r.Stats().PinError)
	require.NoError(t, r.Close())
}
