package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestSampler(t *testing.T) {
	logits := func() []float32 { return []float32{1, 3, 2, 2.9, -1} }
	cases := []struct {
		name string
		cfg  Config
		hist []int32
		// allowed are the ids the sampler may return over many draws.
		allowed map[int32]bool
	}{
		{"greedy", Config{}, nil, map[int32]bool{1: true}},
		{"top-k 1", Config{Temperature: 1, TopK: 1}, nil, map[int32]bool{1: true}},
		{"top-k 2", Config{Temperature: 5, TopK: 2}, nil, map[int32]bool{1: true, 3: true}},
		{"top-p", Config{Temperature: 1, TopP: 0.5}, nil, map[int32]bool{1: true, 3: true}},
		{"repeat penalty", Config{RepeatPenalty: 2}, []int32{1}, map[int32]bool{3: true}},
		// 3 - 2*0.1 = 2.8 < 2.9: the token seen twice loses the argmax, once would not
		{"frequency penalty", Config{FrequencyPenalty: 0.1}, []int32{1, 1}, map[int32]bool{3: true}},
		{"frequency penalty once", Config{FrequencyPenalty: 0.05}, []int32{1}, map[int32]bool{1: true}},
		{"presence penalty", Config{PresencePenalty: 0.2}, []int32{1, 1, 1}, map[int32]bool{3: true}},
		{"negative presence favours", Config{PresencePenalty: -5}, []int32{4}, map[int32]bool{4: true}},
		{"penalty window", Config{PresencePenalty: 1, RepeatLastN: 1}, []int32{1, 0}, map[int32]bool{1: true}},
		{"logit bias bans", Config{LogitBias: map[int32]float32{1: -100}}, nil, map[int32]bool{3: true}},
		{"logit bias forces", Config{Temperature: 1, LogitBias: map[int32]float32{4: 100}}, nil, map[int32]bool{4: true}},
		{"logit bias past the vocabulary", Config{LogitBias: map[int32]float32{99: 100}}, nil, map[int32]bool{1: true}},
		// p(1) = 0.42, p(3) = 0.38, p(2) = 0.15: 0.15 < 0.5*0.42
		{"min-p", Config{Temperature: 1, MinP: 0.5}, nil, map[int32]bool{1: true, 3: true}},
		{"min-p 1", Config{Temperature: 1, MinP: 1}, nil, map[int32]bool{1: true}},
		// entropy 1.22 nats; surprises -log p: 3 -> 0.99, 1 -> 0.89, 2 -> 1.89: the most typical
		// token is not the most likely one
		{"typical-p most typical", Config{Temperature: 1, TypicalP: 0.3}, nil, map[int32]bool{3: true}},
		{"typical-p", Config{Temperature: 1, TypicalP: 0.5}, nil, map[int32]bool{1: true, 3: true}},
		{"typical-p 0.9", Config{Temperature: 1, TypicalP: 0.85}, nil, map[int32]bool{1: true, 2: true, 3: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := New(c.cfg)
			seen := map[int32]bool{}
			for i := 0; i < 200; i++ {
				id := s.Sample(logits(), c.hist)
				assert.True(t, c.allowed[id], "drew %d", id)
				seen[id] = true
			}
			assert.Equal(t, c.allowed, seen, "every allowed token is drawn at some point")
		})
	}
	assert.Equal(t, int32(-1), New(Config{Temperature: 1}).Sample(nil, nil))
}

func TestSamplerSeedIsDeterministic(t *testing.T) {
	draw := func(seed uint64) []int32 {
		s := New(Config{Temperature: 1, Seed: seed})
		var out []int32
		for i := 0; i < 50; i++ {
			out = append(out, s.Sample([]float32{0, 0.1, 0.2, 0.3, 0.4, 0.5}, nil))
		}
		return out
	}
	assert.Equal(t, draw(7), draw(7))
	assert.NotEqual(t, draw(7), draw(8))
}

// The top-k heap and the total order give exactly the candidates, in the order, that a stable
// sort of the whole vocabulary by probability cut at k gives (ties are common: quantized logits).
func TestBestKMatchesStableSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ n, k, levels int }{
		{10, 1, 3}, {10, 9, 3}, {100, 40, 5}, {1000, 40, 1000}, {1000, 999, 7}, {5, 2, 1},
	} {
		cs := make([]cand, tc.n)
		for i := range cs {
			cs[i] = cand{int32(i), float64(r.IntN(tc.levels))}
		}
		want := slices.Clone(cs)
		sort.SliceStable(want, func(a, b int) bool { return want[a].p > want[b].p })
		got := bestK(slices.Clone(cs), tc.k)
		slices.SortFunc(got, candOrder)
		assert.Equal(t, want[:tc.k], got, "n %d k %d", tc.n, tc.k)
	}
}

// BenchmarkSample draws from a 32000-token vocabulary with temperature and top-k, as `xpu run`
// does by default after every decode step.
func BenchmarkSample(b *testing.B) {
	logits := make([]float32, 32000)
	for i := range logits {
		logits[i] = float32((i*7919)%1000) / 100
	}
	work := make([]float32, len(logits))
	s := New(Config{Temperature: 0.8, TopK: 40, TopP: 0.95, Seed: 1})
	b.ReportAllocs()
	for range b.N {
		copy(work, logits)
		s.Sample(work, nil)
	}
}

func TestSamplerLogprobs(t *testing.T) {
	logits := []float32{1, 3, 2, 2.9, -1}
	var lse float64
	for _, l := range logits {
		lse += math.Exp(float64(l))
	}
	lse = math.Log(lse)
	for _, tc := range []struct {
		name string
		cfg  Config
		want int32
		top  []int32
	}{
		{"greedy, no top", Config{}, 1, nil},
		{"greedy, top 3", Config{TopLogprobs: 3}, 1, []int32{1, 3, 2}},
		{"sampled top-k 1, top 2", Config{Temperature: 1, TopK: 1, TopLogprobs: 2}, 1, []int32{1, 3}},
		{"top past the vocabulary", Config{TopLogprobs: 20}, 1, []int32{1, 3, 2, 0, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []TokenLogprob
			tc.cfg.Logprobs = func(l TokenLogprob) { got = append(got, l) }
			id := New(tc.cfg).Sample(slices.Clone(logits), nil)
			require.Equal(t, tc.want, id)
			require.Len(t, got, 1)
			assert.Equal(t, id, got[0].ID)
			assert.InDelta(t, float64(logits[id])-lse, got[0].Logprob, 1e-9)
			var ids []int32
			for _, p := range got[0].Top {
				ids = append(ids, p.ID)
				assert.InDelta(t, float64(logits[p.ID])-lse, p.Logprob, 1e-9)
			}
			assert.Equal(t, tc.top, ids)
		})
	}
	// the figures are after the penalties: a banned token's logprob is far below the others'
	var got TokenLogprob
	New(Config{LogitBias: map[int32]float32{1: -100}, TopLogprobs: 1,
		Logprobs: func(l TokenLogprob) { got = l }}).Sample(slices.Clone(logits), nil)
	assert.Equal(t, int32(3), got.ID)
	assert.Equal(t, int32(3), got.Top[0].ID)
}

func TestSamplerValidate(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"zero", Config{}, ""},
		{"all set", Config{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, TypicalP: 0.9, RepeatPenalty: 1.1,
			FrequencyPenalty: -2, PresencePenalty: 2, LogitBias: map[int32]float32{5: -100}, TopLogprobs: 20}, ""},
		{"temperature NaN", Config{Temperature: nan}, "temperature"},
		{"min-p over 1", Config{MinP: 1.5}, "min-p"},
		{"min-p negative", Config{MinP: -0.1}, "min-p"},
		{"typical-p over 1", Config{TypicalP: 2}, "typical-p"},
		{"frequency NaN", Config{FrequencyPenalty: nan}, "frequency penalty"},
		{"presence Inf", Config{PresencePenalty: float32(math.Inf(1))}, "presence penalty"},
		{"top logprobs 21", Config{TopLogprobs: 21}, "top logprobs"},
		{"bias negative id", Config{LogitBias: map[int32]float32{-1: 1}}, "logit bias token"},
		{"bias NaN", Config{LogitBias: map[int32]float32{3: nan}}, "logit bias of token 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// chi2Critical is a conservative bound on the chi-square quantile at p = 0.001 (Wilson–
// Hilferty plus margin): a correct sampler fails this test about once in a thousand runs.
func chi2Critical(df int) float64 {
	k := float64(df)
	z := 3.09
	return k * math.Pow(1-2/(9*k)+z*math.Sqrt(2/(9*k)), 3)
}

// TestAcceptTreeDistribution: the speculative-sampling rule keeps the target distribution,
// whatever tokens the children draft (one, several, one outside the distribution).
func TestAcceptTreeDistribution(t *testing.T) {
	s := New(Config{Temperature: 1, Seed: 9})
	dist := []cand{{3, 0.5}, {1, 0.25}, {4, 0.15}, {0, 0.1}}
	for _, drafted := range [][]int32{{3}, {0}, {7}, {1, 3}, {0, 4, 7, 3}, {}} {
		kids := make([]int, len(drafted))
		for i := range kids {
			kids[i] = i
		}
		counts := map[int32]int{}
		const n = 40000
		for range n {
			c, tok := acceptTree(s, dist, drafted, kids)
			if c >= 0 {
				require.Equal(t, drafted[c], tok)
			}
			counts[tok]++
		}
		var stat float64
		for _, c := range dist {
			e := c.p * n
			stat += (float64(counts[c.id]) - e) * (float64(counts[c.id]) - e) / e
		}
		assert.Less(t, stat, chi2Critical(len(dist)-1), "drafts %v: %v", drafted, counts)
		assert.Zero(t, counts[7], "a token outside the distribution is never kept")
	}
}

func TestSamplerConfigValidate(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		name string
		cfg  Config
		msg  string // "" = valid
	}{
		{"zero value (greedy)", Config{}, ""},
		{"typical", Config{Temperature: 0.8, TopP: 0.9, TopK: 40, RepeatPenalty: 1.1}, ""},
		{"top-p 1", Config{Temperature: 1, TopP: 1}, ""},
		{"NaN temperature", Config{Temperature: nan}, "temperature NaN"},
		{"infinite temperature", Config{Temperature: inf}, "temperature +Inf"},
		{"negative temperature", Config{Temperature: -1}, "temperature -1"},
		{"top-p 2", Config{TopP: 2}, "top-p 2"},
		{"NaN top-p", Config{TopP: nan}, "top-p NaN"},
		{"negative top-k", Config{TopK: -3}, "top-k -3"},
		{"NaN repeat penalty", Config{RepeatPenalty: nan}, "repeat penalty NaN"},
		{"negative repeat window", Config{RepeatLastN: -1}, "repeat window -1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.msg == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}
