package sparse

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
)

// tracePred replays recorded selections: token t's FFN input is tokens(D, t), and layer l's
// selection for it is sets[l][t]. It makes the benchmark measure the runtime, not a predictor.
type tracePred struct{ sets [][][]int32 }

func (p tracePred) Predict(l int, x []float32, dst []int32) []int32 {
	return append(dst, p.sets[l][int(x[0])]...)
}

// BenchmarkRuntimeDecode measures one decode token's Selects and waits (every layer) on a
// generated sidecar, replaying the truly active neurons of a real forward pass over the
// calibration text (a synthetic Q8_0 ReLU model with Zipf-skewed firing), with an eighth of each
// layer's neurons hot and a cold cache of 1.25 layers' neurons, for each eviction policy. Metrics:
// cold bytes read and reads per token, the cold cache's hit rate.
func BenchmarkRuntimeDecode(b *testing.B) {
	ctx := context.Background()
	spec := synth.Spec{Arch: "llama", Name: "b", Dim: 256, Layers: 4, Heads: 4, KVHeads: 2, FFN: 1024, Vocab: 512,
		Context: 256, Type: core.Q8_0, Seed: 11, Activation: "relu", Sparsity: 0.9, Skew: "zipf"}
	dir := b.TempDir()
	mpath := filepath.Join(dir, "b.gguf")
	f, err := os.Create(mpath)
	require.NoError(b, err)
	require.NoError(b, synth.Write(f, spec))
	require.NoError(b, f.Close())
	m, err := llm.Open(mpath)
	require.NoError(b, err)
	defer m.Close()
	c := m.Config
	toks := calib(m, 200)
	T, D, F := len(toks), c.Dim, c.FFN

	// Record each layer's active neurons per token, in model order, and order the bundles
	// hot-first by measured frequency.
	active := make([][][]int32, c.Layers)
	_, err = Forward(ctx, m, toks, func(l int, _, gate []float32) error {
		active[l] = make([][]int32, T)
		for t := range T {
			for i, g := range gate[t*F : (t+1)*F] {
				if g > 0 {
					active[l][t] = append(active[l][t], int32(i))
				}
			}
		}
		return nil
	})
	require.NoError(b, err)
	h, err := ModelHash(m.File)
	require.NoError(b, err)
	const rank = 4
	p := &Plan{Meta: Meta{ModelHash: h, Activation: ActReLU, Gated: true, PredRank: rank, CalibTokens: T},
		D: D, F: F, BundleType: core.Q8_0}
	sets := make([][][]int32, c.Layers)
	for l := range c.Layers {
		cnt := make([]float32, F)
		for _, a := range active[l] {
			for _, i := range a {
				cnt[i]++
			}
		}
		order := make([]int32, F)
		for i := range order {
			order[i] = int32(i)
		}
		sort.SliceStable(order, func(a, b int) bool { return cnt[order[a]] > cnt[order[b]] })
		row := make([]int32, F) // model neuron → bundle row
		freq := make([]float32, F)
		for r, n := range order {
			row[n] = int32(r)
			freq[r] = cnt[n] / float32(T)
		}
		sets[l] = make([][]int32, T)
		for t, a := range active[l] {
			for _, n := range a {
				sets[l][t] = append(sets[l][t], row[n])
			}
		}
		bundle, err := BuildBundles(m, l, order)
		require.NoError(b, err)
		p.Layers = append(p.Layers, Layer{Bundle: bundle, Order: order, Freq: freq, PredA: make([]float32, rank*D),
			PredB: make([]float32, F*rank), PredBias: make([]float32, F)})
		p.HotCounts = append(p.HotCounts, F/8)
		p.Recall, p.Precision = append(p.Recall, 0), append(p.Precision, 0)
	}
	rb := core.Q8_0.Bytes(int64(3 * D))
	fx := FixedRegion(m, 256, core.F32, rank)
	p.BudgetBytes = uint64(fx.Total() + stagingSize(1<<20, rb) + int64(c.Layers*F/8+F*5/4)*rb)
	path := DefaultPath(mpath)
	require.NoError(b, WriteFile(path, p))
	sc, err := OpenFor(path, m)
	require.NoError(b, err)
	defer sc.Close()

	for _, ev := range []Eviction{EvictLRU, EvictLeastFrequent} {
		b.Run(ev.String(), func(b *testing.B) {
			r, err := NewRuntime(ctx, m, sc, path, WithContext(256, core.F32), WithPredictor(tracePred{sets}), WithEviction(ev))
			require.NoError(b, err)
			defer r.Close()
			require.NoError(b, r.Load(ctx, make([]byte, r.Layout().Rows*rb)))
			now, later := make([]int32, F), make([]int32, F)
			hs := make([][]float32, T)
			for t := range hs {
				hs[t] = tokens(D, t)
			}
			token := func(t int) {
				for l := range c.Layers {
					wait, err := r.Select(ctx, l, hs[t%T], nil, nil, now, later)
					if err == nil {
						err = wait()
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			for t := range T { // warm the cache with one pass over the text
				token(t)
			}
			st0 := r.Stats()
			b.ResetTimer()
			for i := range b.N {
				token(i)
			}
			b.StopTimer()
			st := r.Stats()
			n := float64(st.Tokens - st0.Tokens)
			b.ReportMetric(float64(st.BytesRead-st0.BytesRead)/n, "B/token")
			b.ReportMetric(float64(st.Reads-st0.Reads)/n, "reads/token")
			hits, miss := st.ColdHits-st0.ColdHits, st.ColdMisses-st0.ColdMisses
			b.ReportMetric(100*float64(hits)/float64(max(1, hits+miss)), "hit%")
			b.ReportMetric(float64(st.Selected-st0.Selected)/n/float64(c.Layers), "rows/layer")
		})
	}
}
