package sparse

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
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
	"github.com/xpuhub/xpu/llm"
)

// rtCtx is the context the runtime tests size the fixed region for.
const rtCtx = 64

// rtFixture is a small sparse model with a sidecar whose order, frequencies and predictors are
// random (no profiling: fast), with the hot counts and budget a test asks for.
type rtFixture struct {
	m    *llm.Model
	sc   *Sidecar
	path string
	fx   Fixed
	rb   int64
}

// newRTFixture writes the sidecar; budgetRows is how many bundle rows the sidecar's budget
// leaves after the fixed region and a staging buffer of stagingMin (see withIO).
func newRTFixture(t testing.TB, dt core.DType, hot []int, budgetRows, stagingMin int64) *rtFixture {
	t.Helper()
	m, mpath := sparseModel(t, dt, "relu")
	c := m.Config
	h, err := ModelHash(m.File)
	require.NoError(t, err)
	const rank = 4
	rng := rand.New(rand.NewPCG(5, uint64(dt)))
	norm := func(n int, scale, shift float64) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = float32(rng.NormFloat64()*scale + shift)
		}
		return xs
	}
	gt, _ := m.File.Tensor("blk.0.ffn_gate.weight")
	rb := gt.DType.Bytes(int64(BundleWidth(c.Dim, true)))
	fx := FixedRegion(m, rtCtx, core.F32, rank)
	p := &Plan{Meta: Meta{ModelHash: h, Activation: ActReLU, Gated: true, PredRank: rank, CalibTokens: 1,
		BudgetBytes: uint64(fx.Total() + stagingSize(stagingMin, rb) + budgetRows*rb)}, D: c.Dim, F: c.FFN, BundleType: gt.DType}
	for l := range c.Layers {
		order := make([]int32, c.FFN)
		for i, n := range rng.Perm(c.FFN) {
			order[i] = int32(n)
		}
		freq := make([]float32, c.FFN)
		for i := range freq {
			freq[i] = 1 - float32(i)/float32(c.FFN)
		}
		b, err := BuildBundles(m, l, order)
		require.NoError(t, err)
		p.Layers = append(p.Layers, Layer{Bundle: b, Order: order, Freq: freq, PredA: norm(rank*c.Dim, 0.3, 0),
			PredB: norm(c.FFN*rank, 1, 0), PredBias: norm(c.FFN, 0.5, -1)})
		p.Recall = append(p.Recall, 0)
		p.Precision = append(p.Precision, 0)
	}
	p.HotCounts = hot
	path := DefaultPath(mpath)
	require.NoError(t, WriteFile(path, p))
	sc, err := OpenFor(path, m)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sc.Close() })
	return &rtFixture{m: m, sc: sc, path: path, fx: fx, rb: rb}
}

// open makes a runtime over f (context rtCtx, F32 KV) and loads it into a fresh cache.
func (f *rtFixture) open(t testing.TB, path string, opts ...RuntimeOption) (*Runtime, []byte) {
	t.Helper()
	// The fixtures' budgets hold one I/O buffer: one reader unless a test asks for more; the
	// sidecar's hot rows exactly, so the tests choose what is cold.
	r, err := NewRuntime(context.Background(), f.m, f.sc, path, append([]RuntimeOption{WithContext(rtCtx, core.F32), WithReaders(1), WithPlannedHot()}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	cache := make([]byte, r.Layout().Rows*f.rb)
	require.NoError(t, r.Load(context.Background(), cache))
	return r, cache
}

// setPred is a host Predictor that reads which set to predict from the token's first value:
// tests build h to select exactly the rows they want.
type setPred struct{ sets [][]int32 }

func (p setPred) Predict(_ int, x []float32, dst []int32) []int32 {
	return append(dst, p.sets[int(x[0])]...)
}

// tokens builds h for c tokens selecting sets ids.
func tokens(d int, ids ...int) []float32 {
	h := make([]float32, len(ids)*d)
	for t, id := range ids {
		h[t*d] = float32(id)
	}
	return h
}

// checkCache asserts that every row named in now and later holds layer l's bundle row the
// runtime put there, and that together they are exactly the rows wanted.
func checkCache(t *testing.T, f *rtFixture, r *Runtime, cache []byte, l int, now, later []int32, want []int32) {
	t.Helper()
	bundle := f.sc.Bundle(l)
	got := map[int32]bool{}
	for _, list := range [][]int32{now, later} {
		for _, row := range list {
			if row < 0 {
				continue
			}
			i := r.rowAt(l, int64(row))
			require.GreaterOrEqual(t, i, int32(0), "cache row %d holds no neuron of layer %d", row, l)
			require.False(t, got[i], "bundle row %d listed twice", i)
			got[i] = true
			require.True(t, bytes.Equal(bundle[int64(i)*f.rb:][:f.rb], cache[int64(row)*f.rb:][:f.rb]),
				"layer %d bundle row %d in cache row %d", l, i, row)
		}
	}
	require.Len(t, got, len(want))
	for _, i := range want {
		require.True(t, got[i], "bundle row %d of layer %d not selected", i, l)
	}
}

func TestSplitBudget(t *testing.T) {
	fx := Fixed{Weights: 1000, KV: 500, Predictors: 100}
	const rb, F, staging, stagingMin = 10, 8, 50, 20
	freq := func(l, i int) float32 { return float32(100*l + (F - i)) } // layer 1 hotter than layer 0
	for _, tc := range []struct {
		name    string
		budget  int64
		hot     []int
		wantHot []int
		slots   int64
		demoted int
		staging int64
		bounded bool
		err     string
		planned bool // WithPlannedHot: no promotion
	}{
		{"roomy: every row resident", 1650 + 1000, []int{3, 5}, []int{8, 8}, 0, 0, staging, false, "", false},
		// 14 rows: promoted while the worst layer's cold part still fits the slots.
		{"some room: rows promoted", 1650 + 140, []int{3, 5}, []int{6, 6}, 2, 0, staging, false, "", false},
		{"just enough", 1650 + 130, []int{3, 5}, []int{3, 5}, 5, 0, staging, false, "", true}, // 8 hot + (F - 3) cold
		// Promoting the colder layer's rows frees the slots they take.
		{"just enough, promoted", 1650 + 130, []int{3, 5}, []int{5, 5}, 3, 0, staging, false, "", false},
		{"roomy, planned hot only: slots capped at every cold row", 1650 + 1000, []int{3, 5}, []int{3, 5}, 8, 0, staging, false, "", true},
		// Demoting layer 0's (colder) rows would not free a slot: layer 0's selection grows.
		{"short: demotions that free a slot", 1650 + 110, []int{3, 5}, []int{3, 3}, 5, 2, staging, false, "", true},
		{"short, equal layers: the colder goes below first", 1650 + 100, []int{3, 3}, []int{2, 2}, 6, 2, staging, false, "", true},
		{"one layer's neurons only", 1650 + 80, []int{3, 5}, []int{0, 0}, 8, 8, staging, false, "", true},
		{"no hot rows planned", 1650 + 80, []int{0, 0}, []int{0, 0}, 8, 0, staging, false, "", true},
		{"the I/O buffer shrinks to keep a layer's neurons", 1650 + 79, []int{3, 5}, []int{2, 2}, 6, 4, stagingMin, false, "", true},
		// 6 rows: 5 hot at most (a quarter, at least one, for cold slots), layer 0's first out.
		{"bounded: below one layer", 1620 + 60, []int{3, 5}, []int{0, 5}, 1, 3, stagingMin, true, "", true},
		{"bounded, few hot rows", 1620 + 60, []int{1, 1}, []int{1, 1}, 4, 0, stagingMin, true, "", true},
		{"below the fixed region", 1600, []int{3, 5}, nil, 0, 0, 0, false, "budget 0.0 MiB too small: fixed region needs 0.0 MiB", true},
		{"no room for a row", 1620 + 9, []int{3, 5}, nil, 0, 0, 0, false, "one neuron row 10 bytes", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hot := append([]int(nil), tc.hot...)
			s, err := splitBudget(tc.budget, fx, staging, stagingMin, rb, F, hot, freq, !tc.planned)
			assert.Equal(t, tc.hot, hot, "the caller's hot counts stay")
			if tc.err != "" {
				require.ErrorIs(t, err, core.ErrInvalidArgument)
				require.ErrorIs(t, err, ErrBudget)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantHot, s.Hot)
			assert.Equal(t, tc.slots, s.Slots)
			assert.Equal(t, tc.demoted, s.Demoted)
			assert.Equal(t, tc.staging, s.Staging)
			assert.Equal(t, tc.bounded, s.Bounded)
			assert.LessOrEqual(t, fx.Total()+s.Staging+(s.HotRows()+s.Slots)*rb, tc.budget)
			assert.True(t, s.Slots > 0 || s.HotRows() == int64(F*len(s.Hot)), "cold slots, unless every row is resident")
			for l, h := range s.Hot {
				if !s.Bounded {
					assert.GreaterOrEqual(t, s.Slots, int64(F-h), "layer %d's selection must fit", l)
				}
			}
		})
	}
}

// A budget below one layer's neurons runs: a selection larger than the cold slots loses its
// least frequent neurons, and Stats says how many.
func TestRuntimeBounded(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{4, 4}, 1000, 1<<20)
	var set []int32
	for i := int32(0); i < 158; i++ { // rows 0..3 hot, 150 cold rows 4..153 wanted, 4 more
		set = append(set, i)
	}
	budget := f.fx.Total() + stagingSize(0, f.rb) + 100*f.rb
	r, cache := f.open(t, f.path, WithBudget(budget), WithPredictor(setPred{[][]int32{set}}))
	require.Equal(t, int64(92), r.split.Slots)
	now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
	wait, err := r.Select(context.Background(), 0, tokens(f.sc.D, 0), nil, nil, now, later)
	require.NoError(t, err)
	require.NoError(t, wait())
	checkCache(t, f, r, cache, 0, now, later, set[:4+92])
	st := r.Stats()
	assert.True(t, st.Bounded)
	assert.Equal(t, int64(158-4-92), st.Dropped)
	assert.Equal(t, st.Selected, st.HotRows+st.ColdHits+st.ColdMisses+st.Dropped)
	assert.Contains(t, st.String(), "62 selected rows (39.24%) dropped")
}

func TestEvictors(t *testing.T) {
	type op struct {
		kind string // push, hit, remove, victim
		s    int32
	}
	for _, tc := range []struct {
		policy Eviction
		ops    []op
		want   []int32 // victims, in order
	}{
		{EvictLRU, []op{{"push", 0}, {"push", 1}, {"push", 2}, {"hit", 0}, {"victim", 0}, {"victim", 0}, {"victim", 0}, {"victim", 0}},
			[]int32{1, 2, 0, -1}},
		{EvictLRU, []op{{"push", 0}, {"push", 1}, {"push", 2}, {"remove", 0}, {"victim", 0}, {"push", 0}, {"victim", 0}},
			[]int32{1, 2}},
		{EvictLeastFrequent, []op{{"push", 0}, {"push", 1}, {"push", 2}, {"hit", 0}, {"hit", 0}, {"hit", 2},
			{"victim", 0}, {"victim", 0}, {"victim", 0}, {"victim", 0}}, []int32{1, 2, 0, -1}},
		// Equal use counts: the least recently used goes first; a reloaded slot starts over.
		{EvictLeastFrequent, []op{{"push", 0}, {"push", 1}, {"hit", 0}, {"hit", 1}, {"push", 3}, {"remove", 1},
			{"victim", 0}, {"push", 1}, {"victim", 0}, {"victim", 0}}, []int32{3, 1, 0}},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			e := newEvictor(tc.policy, 4)
			var got []int32
			for _, o := range tc.ops {
				switch o.kind {
				case "push":
					e.push(o.s, false)
				case "hit":
					e.remove(o.s)
					e.push(o.s, true)
				case "remove":
					e.remove(o.s)
				case "victim":
					got = append(got, e.victim())
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// Select puts hot rows and cold hits in now and misses in later, pads with -1, and after wait
// the cache holds the sidecar's bytes for every row listed.
func TestRuntimeSelect(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{4, 2}, 1000, 1<<20)
	D := f.sc.D
	pred := setPred{sets: [][]int32{{0, 1, 5, 7, 100}, {1, 5, 200}, {3, 383}, {}}}
	r, cache := f.open(t, f.path, WithPredictor(pred))
	lay := r.Layout()
	assert.Empty(t, lay.Predictors, "a host predictor needs none in the graph")
	assert.Equal(t, int64(4+2)+r.split.Slots, lay.Rows)
	assert.Equal(t, int64(2*384-6), r.split.Slots, "a roomy budget caches every cold row")
	ctx := context.Background()
	F := f.sc.F
	now, later := make([]int32, F), make([]int32, F)
	type step struct {
		l              int
		ids            []int
		want           []int32
		hot, hits, mis int
	}
	for i, s := range []step{
		{0, []int{0}, []int32{0, 1, 5, 7, 100}, 2, 0, 3},
		{0, []int{1}, []int32{1, 5, 200}, 1, 1, 1},
		{1, []int{0, 1}, []int32{0, 1, 5, 7, 100, 200}, 2, 0, 4}, // a chunk: the union
		{0, []int{2, 1}, []int32{1, 3, 5, 200, 383}, 2, 2, 1},
		{1, []int{3}, nil, 0, 0, 0},
	} {
		before := r.Stats()
		wait, err := r.Select(ctx, s.l, tokens(D, s.ids...), nil, nil, now, later)
		require.NoError(t, err)
		require.NoError(t, wait())
		require.NoError(t, wait(), "wait may be called again")
		nNow, nLater := listed(now), listed(later)
		assert.Equal(t, s.hot+s.hits, nNow, "step %d: now", i)
		assert.Equal(t, s.mis, nLater, "step %d: later", i)
		for _, row := range later[:nLater] {
			assert.GreaterOrEqual(t, row, int32(r.coldBase), "step %d: a miss lands in a cold slot", i)
		}
		checkCache(t, f, r, cache, s.l, now, later, s.want)
		st := r.Stats()
		assert.Equal(t, int64(s.hot), st.HotRows-before.HotRows, "step %d", i)
		assert.Equal(t, int64(s.hits), st.ColdHits-before.ColdHits, "step %d", i)
		assert.Equal(t, int64(s.mis), st.ColdMisses-before.ColdMisses, "step %d", i)
	}
	st := r.Stats()
	assert.Equal(t, int64(1+1+2), st.Tokens, "tokens are counted at layer 0")
	assert.Equal(t, int64(5), st.Selects)
	assert.GreaterOrEqual(t, st.BytesRead, 9*f.rb)
	assert.GreaterOrEqual(t, st.LoadBytes, 6*f.rb)
}

// listed is how many leading entries of an index list are set; the rest must be -1.
func listed(xs []int32) int {
	n := 0
	for n < len(xs) && xs[n] >= 0 {
		n++
	}
	for _, x := range xs[n:] {
		if x != -1 {
			return -1
		}
	}
	return n
}

// Random selections through a cold cache too small for them, for each bundle dtype, with direct
// and buffered reads, both eviction policies, small I/O buffers (many coalesced reads) and one
// or several readers: the cache rows always hold the sidecar's bytes.
func TestRuntimeCacheContents(t *testing.T) {
	for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0} {
		f := newRTFixture(t, dt, []int{16, 40}, 16+40+400, 8<<10)
		// room for three readers' buffers besides the same rows: stagingSize(3·one − 2 pages) is
		// 3·one
		f3 := newRTFixture(t, dt, []int{16, 40}, 16+40+400, 3*stagingSize(8<<10, f.rb)-2*ioAlign)
		rng := rand.New(rand.NewPCG(7, 7))
		sets := make([][]int32, 64)
		for i := range sets {
			n := 10 + rng.IntN(50)
			for range n {
				// skewed: low rows far more often, so the cache has hits to keep
				sets[i] = append(sets[i], int32(min(383, int(rng.ExpFloat64()*60))))
			}
		}
		for _, buffered := range []bool{false, true} {
			for _, ev := range []Eviction{EvictLRU, EvictLeastFrequent} {
				for _, readers := range []int{1, 3} {
					name := fmt.Sprintf("%s/%s/readers=%d", dt, ev, readers)
					opts := []RuntimeOption{WithPredictor(setPred{sets}), WithEviction(ev), withIO(8<<10, 8<<10), WithReaders(readers)}
					if buffered {
						name += "/buffered"
						opts = append(opts, WithBufferedIO())
					}
					t.Run(name, func(t *testing.T) {
						f := f
						if readers > 1 {
							f = f3
						}
						r, cache := f.open(t, f.path, opts...)
						require.Equal(t, int64(400), r.split.Slots, "456 rows of budget less 56 hot")
						require.Equal(t, readers, len(r.w.staging), "each reader has its own buffer")
						ctx := context.Background()
						now, later := make([]int32, f.sc.F), make([]int32, f.sc.F)
						for step := range 200 {
							l := step % 2
							a, b := rng.IntN(len(sets)), rng.IntN(len(sets))
							wait, err := r.Select(ctx, l, tokens(f.sc.D, a, b), nil, nil, now, later)
							require.NoError(t, err)
							require.NoError(t, wait())
							checkCache(t, f, r, cache, l, now, later, union(sets[a], sets[b]))
						}
						st := r.Stats()
						assert.Positive(t, st.ColdHits)
						assert.Positive(t, st.ColdMisses)
						if buffered {
							assert.False(t, st.DirectIO)
						}
						assert.Equal(t, st.Selected, st.HotRows+st.ColdHits+st.ColdMisses)
						assert.False(t, st.Bounded)
					})
				}
			}
		}
	}
}

// A threshold offset selects the neurons whose logit exceeds the sidecar's threshold plus the
// offset, whether the runner gives the logits or the runtime computes them; a non-finite
// offset is refused.
func TestRuntimeThresholdOffset(t *testing.T) {
	f := newRTFixture(t, core.F32, []int{8, 8}, 1000, 1<<20)
	c := f.m.Config
	tr := f.sc.Predictor()
	rng := rand.New(rand.NewPCG(5, 6))
	h := make([]float32, c.Dim)
	for i := range h {
		h[i] = float32(rng.NormFloat64())
	}
	lg := tr.Logits(0, h, nil)
	for _, off := range []float32{-0.5, 0, 0.5, 2} {
		t.Run(fmt.Sprint(off), func(t *testing.T) {
			var want []int32
			for i, v := range lg {
				if v > tr.Threshold+off {
					want = append(want, int32(i))
				}
			}
			r, cache := f.open(t, f.path, WithThresholdOffset(off))
			now, later := make([]int32, c.FFN), make([]int32, c.FFN)
			for _, logits := range [][]float32{lg, nil} {
				wait, err := r.Select(context.Background(), 0, h, logits, nil, now, later)
				require.NoError(t, err)
				require.NoError(t, wait())
				checkCache(t, f, r, cache, 0, now, later, want)
			}
			assert.Equal(t, tr.Threshold, f.sc.Predictor().Threshold, "the sidecar's threshold stays")
		})
	}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		_, err := NewRuntime(context.Background(), f.m, f.sc, f.path, WithThresholdOffset(bad))
		require.ErrorIs(t, err, core.ErrInvalidArgument)
	}
	_, err := NewRuntime(context.Background(), f.m, f.sc, f.path, WithReaders(0))
	require.ErrorIs(t, err, core.ErrInvalidArgument)
}

func union(a, b []int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, x := range append(append([]int32(nil), a...), b...) {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// rowAt is the bundle row of layer l that cache row row holds, -1 when none (tests).
func (r *Runtime) rowAt(l int, row int64) int32 {
	if row < r.coldBase {
		for ll := r.L - 1; ll >= 0; ll-- {
			if row >= r.hotBase[ll] {
				if ll != l || row-r.hotBase[ll] >= int64(r.split.Hot[ll]) {
					return -1
				}
				return int32(row - r.hotBase[ll])
			}
		}
		return -1
	}
	k := r.slotKey[row-r.coldBase]
	if k < 0 || int(k)/r.F != l {
		return -1
	}
	return k % int32(r.F)
}

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
