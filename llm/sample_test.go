package llm

import (
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSampler(t *testing.T) {
	logits := func() []float32 { return []float32{1, 3, 2, 2.9, -1} }
	cases := []struct {
		name string
		cfg  SamplerConfig
		hist []int32
		// allowed are the ids the sampler may return over many draws.
		allowed map[int32]bool
	}{
		{"greedy", SamplerConfig{}, nil, map[int32]bool{1: true}},
		{"top-k 1", SamplerConfig{Temperature: 1, TopK: 1}, nil, map[int32]bool{1: true}},
		{"top-k 2", SamplerConfig{Temperature: 5, TopK: 2}, nil, map[int32]bool{1: true, 3: true}},
		{"top-p", SamplerConfig{Temperature: 1, TopP: 0.5}, nil, map[int32]bool{1: true, 3: true}},
		{"repeat penalty", SamplerConfig{RepeatPenalty: 2}, []int32{1}, map[int32]bool{3: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSampler(c.cfg)
			seen := map[int32]bool{}
			for i := 0; i < 200; i++ {
				id := s.Sample(logits(), c.hist)
				assert.True(t, c.allowed[id], "drew %d", id)
				seen[id] = true
			}
			assert.Equal(t, c.allowed, seen, "every allowed token is drawn at some point")
		})
	}
	assert.Equal(t, int32(-1), NewSampler(SamplerConfig{Temperature: 1}).Sample(nil, nil))
}

func TestSamplerSeedIsDeterministic(t *testing.T) {
	draw := func(seed uint64) []int32 {
		s := NewSampler(SamplerConfig{Temperature: 1, Seed: seed})
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
	s := NewSampler(SamplerConfig{Temperature: 0.8, TopK: 40, TopP: 0.95, Seed: 1})
	b.ReportAllocs()
	for range b.N {
		copy(work, logits)
		s.Sample(work, nil)
	}
}
