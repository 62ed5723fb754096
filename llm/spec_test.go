package llm

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/draft"
)

// summaryPrompt is a summary-style task: the prompt holds a story the model goes on to retell.
const summaryPrompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " +
	"One day, she saw a big, red ball. She wanted to play with it, but it was too high. " +
	"Lily asked her mom to help her. Her mom said, \"Let's go to the park and play with the ball.\" " +
	"Lily was so happy. She played with the ball all day long. Once upon a time, there was a little girl named Lily."

// specPrompts: BOS only (the published sample), the summary task and short starts.
var specPrompts = []string{"", summaryPrompt, "Tom and his dog", "Lily"}

// drafters are every drafter, fresh for each generation.
func drafters() map[string]func() draft.Drafter {
	return map[string]func() draft.Drafter{
		"lookup":    func() draft.Drafter { return draft.NewLookup() },
		"retrieval": func() draft.Drafter { return draft.NewRetrieval(draft.RetrievalOptions{}) },
		"retrieval without calibration and reuse": func() draft.Drafter {
			return draft.NewRetrieval(draft.RetrievalOptions{CalibrateTopK: -1, NoReuse: true})
		},
	}
}

func specRunner(t testing.TB, m *Model, dev core.Device, opts ...RunnerOption) *Runner {
	r, err := NewRunner(context.Background(), m, dev, append([]RunnerOption{WithVerifyLengths(8, 16, 32), WithChunkSize(16)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestSpecGreedyIdentical: with every drafter, choosing lengths or verifying every draft,
// greedy output is plain decoding's, byte for byte, over 256 tokens and several prompts (on
// neon, fast; the reference runs the published sample).
func TestSpecGreedyIdentical(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	t.Run("ref", func(t *testing.T) {
		want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
		require.NoError(t, err)
		r := specRunner(t, m, refDevice(t))
		res, err := r.Generate(ctx, "", WithMaxTokens(256), WithSpeculative(draft.NewRetrieval(draft.RetrievalOptions{}), SpecAlways()))
		require.NoError(t, err)
		require.Equal(t, strings.TrimSuffix(string(want), "\n"), res.Text)
		require.Positive(t, res.Spec.Accepted, "drafts were accepted: %s", res.Spec)
	})
	t.Run("neon", func(t *testing.T) {
		r := specRunner(t, m, pluginDevices(t, "neon")[0])
		for _, prompt := range specPrompts {
			plain, err := r.Generate(ctx, prompt, WithMaxTokens(256))
			require.NoError(t, err)
			for name, mk := range drafters() {
				for _, always := range []bool{false, true} {
					var o []SpecOption
					if always {
						o = append(o, SpecAlways())
					}
					res, err := r.Generate(ctx, prompt, WithMaxTokens(256), WithSpeculative(mk(), o...))
					require.NoError(t, err, name)
					require.Equal(t, plain.Text, res.Text, "%s always=%v prompt %q", name, always, prompt)
					require.Equal(t, plain.Tokens, res.Tokens)
					require.Equal(t, plain.Stop, res.Stop)
					// the first token comes from prefill, the others from passes (the last pass's
					// tokens may pass the budget)
					require.LessOrEqual(t, len(res.Tokens), 1+res.Spec.Passes+res.Spec.Accepted)
					require.GreaterOrEqual(t, len(res.Tokens), res.Spec.Passes)
					if always {
						require.Positive(t, res.Spec.Verifies, "%s prompt %q", name, prompt)
					}
				}
			}
		}
	})
}

// kvRows are the cache's first n rows of every layer, K then V, as floats.
func kvRows(r *Runner, n int) [][]float32 {
	kRow, vRow := r.cfg.kv.rowBytes(r.m.Config)
	var out [][]float32
	for _, kv := range r.kv {
		for i, s := range kv {
			rowBytes, dt := kRow, r.cfg.kv.K
			if i == 1 {
				rowBytes, dt = vRow, r.cfg.kv.V
			}
			x, err := core.Dequantize(dt, r.rt.Arena().Bytes(s)[:int64(n)*rowBytes], 0)
			if err != nil {
				panic(err) // the cache's own dtype and whole rows: cannot fail
			}
			out = append(out, x)
		}
	}
	return out
}

// TestSpecKVRowsEqualPlain: after verifies that accept part of each draft and roll the rest
// back, the cache rows of the accepted path are plain decoding's, on every backend and when
// the cache is shared between units.
func TestSpecKVRowsEqualPlain(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	type setup struct {
		backends []string
		plan     string
		tree     bool // every unit takes the tree mask
	}
	setups := map[string]setup{
		"ref":    {nil, "", true},
		"neon":   {[]string{"neon"}, `{"units":["neon"],"prefill":{"rules":[{"unit":"neon"}]}}`, true},
		"opencl": {[]string{"opencl"}, `{"units":["opencl"],"prefill":{"rules":[{"unit":"opencl"}]}}`, true},
		"qnn (emulated) MATMULs, neon the rest": {[]string{"neon", "qnn"},
			`{"units":["neon","qnn"],"prefill":{"rules":[{"unit":"qnn","ops":["MATMUL"]},{"unit":"neon"}]}}`, true},
		// the HTP profile refuses the bit-exact ops at the graph boundary (GET_ROWS, RESHAPE of
		// f32 I/O): they fall back to neon, everything else runs on qnn, tree mask included
		"qnn (emulated) everything it takes": {[]string{"neon", "qnn"},
			`{"units":["qnn","neon"],"prefill":{"rules":[{"unit":"qnn","fallback":"neon"}]}}`, true},
		"neon+opencl sharing the cache by layers": {[]string{"neon", "opencl"},
			`{"units":["neon","opencl"],"prefill":{"rules":[{"unit":"neon","layers":"0-2"},{"unit":"opencl"}]}}`, true},
	}
	ids := m.Tokenizer.Encode("Tom and his dog went to the park", true)
	const n = 40
	for name, s := range setups {
		t.Run(name, func(t *testing.T) {
			open := func() *Runner {
				// an F32 cache: a verify's K differs from a decode step's in the last bits, which
				// an F16 cache can round a whole half-precision step apart (4e-3 at 5)
				opts := []RunnerOption{WithVerifyLengths(8, 16), WithChunkSize(8), WithContextLength(128), WithKVCacheType(core.F32)}
				if s.backends == nil {
					return specRunner(t, m, refDevice(t), opts...)
				}
				r, err := NewPlannedRunner(ctx, m, pluginDevices(t, s.backends...), mustPlan(t, s.plan), opts...)
				require.NoError(t, err)
				t.Cleanup(func() { _ = r.Close() })
				return r
			}
			plain := open()
			logits, err := plain.Prefill(ctx, ids)
			require.NoError(t, err)
			var toks []int32
			for range n {
				tok := argmax(logits)
				toks = append(toks, tok)
				logits, err = plain.Decode(ctx, tok)
				require.NoError(t, err)
			}
			want := kvRows(plain, len(ids)+n)

			r := open()
			_, err = r.Prefill(ctx, ids)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(3, 4))
			for done := 0; done < n; {
				// a draft right for a few tokens, then wrong
				k := min(1+rng.IntN(12), n-done)
				good := rng.IntN(k + 1)
				chain := append([]int32{toks[done]}, toks[done+1:min(done+1+k, n)]...)
				for i := 1 + good; i < len(chain); i++ {
					chain[i] = (chain[i] + 1 + int32(rng.IntN(50))) % int32(m.Config.Vocab)
				}
				base := r.Len()
				if r.TreeVerify() && len(chain) > 7 {
					chain = chain[:7] // 2+2·6 tree nodes and the root fit the 16-token graph
				}
				if !r.TreeVerify() {
					rows, err := r.Verify(ctx, chain)
					require.NoError(t, err)
					acc := 0
					for acc+1 < len(chain) && argmax(rows[acc]) == chain[acc+1] {
						acc++
					}
					require.GreaterOrEqual(t, acc, min(good, len(chain)-1))
					require.NoError(t, r.Truncate(base+1+acc))
					done += 1 + acc
					continue
				}
				// a tree: a wrong branch of two first, then the draft, each of its nodes with a
				// wrong sibling after it, so the accepted rows are not contiguous
				w := func() int32 { return int32(rng.IntN(m.Config.Vocab)) }
				tree := draft.Tree{Tokens: []int32{w(), w()}, Parents: []int{-1, 0}}
				parent := -1
				for _, tok := range chain[1:] {
					tree.Tokens = append(tree.Tokens, tok, w())
					tree.Parents = append(tree.Parents, parent, parent)
					parent = len(tree.Tokens) - 2
				}
				rows, err := r.VerifyTree(ctx, chain[0], tree)
				require.NoError(t, err)
				keep, cur := []int{0}, -1
				for {
					pred, next := argmax(rows[cur+1]), -1
					for i, p := range tree.Parents {
						if p == cur && tree.Tokens[i] == pred {
							next = i
							break
						}
					}
					if next < 0 {
						break
					}
					cur = next
					keep = append(keep, next+1)
				}
				require.GreaterOrEqual(t, len(keep)-1, min(good, len(chain)-1))
				require.NoError(t, r.KeepPath(ctx, base, keep))
				require.Equal(t, base+len(keep), r.Len())
				done += len(keep)
			}
			if s.tree {
				require.True(t, r.TreeVerify(), "the tree path ran")
			}
			require.Equal(t, append(append([]int32(nil), ids...), toks...), r.Tokens()[:len(ids)+n])
			got := kvRows(r, len(ids)+n)
			for i := range want {
				require.InDeltaSlice(t, want[i], got[i], 2e-3, "layer %d %s", i/2, []string{"K", "V"}[i%2])
			}
		})
	}
}

// badDrafter returns what it is given, or panics.
type badDrafter struct {
	tree  draft.Tree
	panic bool
}

func (d *badDrafter) Propose([]int32, int) draft.Tree {
	if d.panic {
		panic("drafter bug")
	}
	return d.tree
}
func (d *badDrafter) Observe(draft.Step) {}

func TestSpecBadInput(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	dev := pluginDevices(t, "neon")[0]
	r := specRunner(t, m, dev, WithContextLength(64))
	plain, err := r.Generate(ctx, "Tom and his dog", WithMaxTokens(40))
	require.NoError(t, err)

	t.Run("drafter returns an invalid tree", func(t *testing.T) {
		for name, tree := range map[string]draft.Tree{
			"token past the vocabulary": draft.Chain([]int32{5, 9999}),
			"parent after child":        {Tokens: []int32{5, 6}, Parents: []int{1, -1}},
			"over the budget":           draft.Chain(make([]int32, 40)),
		} {
			res, err := r.Generate(ctx, "Tom and his dog", WithMaxTokens(40), WithSpeculative(&badDrafter{tree: tree}, SpecAlways()))
			require.NoError(t, err, name)
			assert.Equal(t, plain.Text, res.Text, name)
			assert.Contains(t, res.Spec.Fallback, "invalid draft tree", name)
		}
	})
	t.Run("drafter panics", func(t *testing.T) {
		res, err := r.Generate(ctx, "Tom and his dog", WithMaxTokens(40), WithSpeculative(&badDrafter{panic: true}))
		require.NoError(t, err)
		assert.Equal(t, plain.Text, res.Text)
		assert.Contains(t, res.Spec.Fallback, "panicked")
	})
	t.Run("drafts near the end of the context", func(t *testing.T) {
		// 64 tokens of context: drafts are cut to the room left, and generation stops where
		// plain decoding does
		full, err := r.Generate(ctx, summaryPrompt[:120], WithMaxTokens(200))
		require.NoError(t, err)
		require.Equal(t, StopContext, full.Stop)
		res, err := r.Generate(ctx, summaryPrompt[:120], WithMaxTokens(200), WithSpeculative(draft.NewLookup(), SpecAlways()))
		require.NoError(t, err)
		assert.Equal(t, full.Text, res.Text)
		assert.Equal(t, StopContext, res.Stop)
		assert.LessOrEqual(t, r.Len(), 64)
	})
	t.Run("verify longer than the context left or the graphs", func(t *testing.T) {
		r.Reset()
		_, err := r.Prefill(ctx, make([]int32, 60))
		require.NoError(t, err)
		_, err = r.Verify(ctx, make([]int32, 8))
		require.ErrorIs(t, err, ErrContextFull)
		assert.Equal(t, 60, r.Len(), "a refused verify changes nothing")
		r.Reset()
		_, err = r.Verify(ctx, make([]int32, 33))
		require.ErrorIs(t, err, core.ErrInvalidArgument)
		require.ErrorIs(t, r.Truncate(5), core.ErrInvalidArgument)
	})
	t.Run("no verify graphs", func(t *testing.T) {
		plainRunner, err := NewRunner(ctx, m, dev, WithContextLength(64))
		require.NoError(t, err)
		defer plainRunner.Close()
		_, err = plainRunner.Generate(ctx, "Tom", WithSpeculative(draft.NewLookup()))
		require.ErrorIs(t, err, ErrNoVerifyGraphs)
		require.ErrorIs(t, err, core.ErrInvalidArgument)
	})
	t.Run("bad verify lengths", func(t *testing.T) {
		for _, ls := range [][]int{{1}, {0}, {MaxVerifyLength + 1}, {128}} {
			_, err := NewRunner(ctx, m, dev, WithContextLength(64), WithVerifyLengths(ls...))
			require.ErrorIs(t, err, core.ErrInvalidArgument, "%v", ls)
		}
	})
	t.Run("corrupt history store", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "task.hist")
		require.NoError(t, os.WriteFile(path, []byte("XPUHIST1 garbage"), 0o644))
		h, err := draft.OpenHistory(path, m.Config.Vocab, 0)
		require.ErrorIs(t, err, draft.ErrCorrupt)
		res, err := r.Generate(ctx, "Tom and his dog", WithMaxTokens(40),
			WithSpeculative(draft.NewRetrieval(draft.RetrievalOptions{History: h})))
		require.NoError(t, err)
		assert.Equal(t, plain.Text, res.Text)
		h, err = draft.OpenHistory(path, m.Config.Vocab, 0)
		require.NoError(t, err, "the answer replaced the corrupt file")
		assert.Equal(t, [][]int32{res.Tokens}, h.Answers())
	})
}

// chi2 is Pearson's statistic of two samples' counts over the same categories, and its
// degrees of freedom.
func chi2(a, b map[int32]int) (float64, int) {
	na, nb := 0, 0
	for _, c := range a {
		na += c
	}
	for _, c := range b {
		nb += c
	}
	keys := map[int32]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var x float64
	for k := range keys {
		ea := float64(a[k]+b[k]) * float64(na) / float64(na+nb)
		eb := float64(a[k]+b[k]) * float64(nb) / float64(na+nb)
		x += (float64(a[k])-ea)*(float64(a[k])-ea)/ea + (float64(b[k])-eb)*(float64(b[k])-eb)/eb
	}
	return x, len(keys) - 1
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
	s := NewSampler(SamplerConfig{Temperature: 1, Seed: 9})
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

// fixedDrafter always drafts the same chain: drafts that are sometimes right.
type fixedDrafter struct{ chain []int32 }

func (d fixedDrafter) Propose(_ []int32, budget int) draft.Tree {
	return draft.Chain(d.chain[:min(budget, len(d.chain))])
}
func (fixedDrafter) Observe(draft.Step) {}

// TestSpecSamplingDistribution: with sampling, the tokens speculative decoding produces (each
// position's token, which verify passes choose) have plain sampling's frequencies.
func TestSpecSamplingDistribution(t *testing.T) {
	m := openStories(t)
	ctx := context.Background()
	r := specRunner(t, m, pluginDevices(t, "neon")[0], WithContextLength(64))
	sc := SamplerConfig{Temperature: 1, TopK: 8}
	const runs, pos = 300, 4
	// the model's likeliest continuation is a draft often accepted, in part
	g, err := r.Generate(ctx, "Lily", WithMaxTokens(pos))
	require.NoError(t, err)
	plain, spec := make([]map[int32]int, pos), make([]map[int32]int, pos)
	for i := range pos {
		plain[i], spec[i] = map[int32]int{}, map[int32]int{}
	}
	accepted := 0
	for i := range runs {
		sc.Seed = uint64(i + 1)
		a, err := r.Generate(ctx, "Lily", WithMaxTokens(pos), WithSampler(sc))
		require.NoError(t, err)
		sc.Seed = uint64(runs + i + 1)
		b, err := r.Generate(ctx, "Lily", WithMaxTokens(pos), WithSampler(sc),
			WithSpeculative(fixedDrafter{g.Tokens[1:]}, SpecAlways()))
		require.NoError(t, err)
		accepted += b.Spec.Accepted
		for j := range pos {
			if j < len(a.Tokens) {
				plain[j][a.Tokens[j]]++
			}
			if j < len(b.Tokens) {
				spec[j][b.Tokens[j]]++
			}
		}
	}
	require.Positive(t, accepted, "some drafts were accepted, so the rule ran both ways")
	for j := 1; j < pos; j++ {
		stat, df := chi2(plain[j], spec[j])
		if df == 0 {
			continue
		}
		assert.Less(t, stat, chi2Critical(df), "position %d: plain %v speculative %v", j, plain[j], spec[j])
	}
}
