package sparse

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
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
