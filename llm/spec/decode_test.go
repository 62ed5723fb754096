package spec

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/synth"
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

// TestSpecGreedyIdentical: with every drafter, choosing lengths or verifying every draft,
// greedy output is plain decoding's, byte for byte, over 256 tokens and several prompts (on
// neon, fast; the reference runs the published sample).
func TestSpecGreedyIdentical(t *testing.T) {
	m := llmtest.Stories(t)
	ctx := context.Background()
	t.Run("ref", func(t *testing.T) {
		want, err := os.ReadFile(filepath.Join(llmtest.ModelsDir(t), "stories260K.greedy.txt"))
		require.NoError(t, err)
		r := specRunner(t, m, llmtest.RefDevice(t))
		res, err := r.Generate(ctx, "", llm.WithMaxTokens(256), With(draft.NewRetrieval(draft.RetrievalOptions{}), Always()))
		require.NoError(t, err)
		require.Equal(t, strings.TrimSuffix(string(want), "\n"), res.Text)
		require.Positive(t, StatsOf(res).Accepted, "drafts were accepted: %s", StatsOf(res))
	})
	t.Run("neon", func(t *testing.T) {
		r := specRunner(t, m, llmtest.PluginDevices(t, "neon")[0])
		for _, prompt := range specPrompts {
			plain, err := r.Generate(ctx, prompt, llm.WithMaxTokens(256))
			require.NoError(t, err)
			for name, mk := range drafters() {
				for _, always := range []bool{false, true} {
					var o []Option
					if always {
						o = append(o, Always())
					}
					res, err := r.Generate(ctx, prompt, llm.WithMaxTokens(256), With(mk(), o...))
					require.NoError(t, err, name)
					require.Equal(t, plain.Text, res.Text, "%s always=%v prompt %q", name, always, prompt)
					require.Equal(t, plain.Tokens, res.Tokens)
					require.Equal(t, plain.Stop, res.Stop)
					// the first token comes from prefill, the others from passes (the last pass's
					// tokens may pass the budget)
					require.LessOrEqual(t, len(res.Tokens), 1+StatsOf(res).Passes+StatsOf(res).Accepted)
					require.GreaterOrEqual(t, len(res.Tokens), StatsOf(res).Passes)
					if always {
						require.Positive(t, StatsOf(res).Verifies, "%s prompt %q", name, prompt)
					}
				}
			}
		}
	})
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
	m := llmtest.Stories(t)
	ctx := context.Background()
	dev := llmtest.PluginDevices(t, "neon")[0]
	r := specRunner(t, m, dev, llm.WithContextLength(64))
	plain, err := r.Generate(ctx, "Tom and his dog", llm.WithMaxTokens(40))
	require.NoError(t, err)

	t.Run("drafter returns an invalid tree", func(t *testing.T) {
		for name, tree := range map[string]draft.Tree{
			"token past the vocabulary": draft.Chain([]int32{5, 9999}),
			"parent after child":        {Tokens: []int32{5, 6}, Parents: []int{1, -1}},
			"over the budget":           draft.Chain(make([]int32, 40)),
		} {
			res, err := r.Generate(ctx, "Tom and his dog", llm.WithMaxTokens(40), With(&badDrafter{tree: tree}, Always()))
			require.NoError(t, err, name)
			assert.Equal(t, plain.Text, res.Text, name)
			assert.Contains(t, StatsOf(res).Fallback, "invalid draft tree", name)
		}
	})
	t.Run("drafter panics", func(t *testing.T) {
		res, err := r.Generate(ctx, "Tom and his dog", llm.WithMaxTokens(40), With(&badDrafter{panic: true}))
		require.NoError(t, err)
		assert.Equal(t, plain.Text, res.Text)
		assert.Contains(t, StatsOf(res).Fallback, "panicked")
	})
	t.Run("drafts near the end of the context", func(t *testing.T) {
		// 64 tokens of context: drafts are cut to the room left, and generation stops where
		// plain decoding does
		full, err := r.Generate(ctx, summaryPrompt[:120], llm.WithMaxTokens(200))
		require.NoError(t, err)
		require.Equal(t, llm.StopContext, full.Stop)
		res, err := r.Generate(ctx, summaryPrompt[:120], llm.WithMaxTokens(200), With(draft.NewLookup(), Always()))
		require.NoError(t, err)
		assert.Equal(t, full.Text, res.Text)
		assert.Equal(t, llm.StopContext, res.Stop)
		assert.LessOrEqual(t, r.Len(), 64)
	})
	t.Run("verify longer than the context left or the graphs", func(t *testing.T) {
		r.Reset()
		_, err := r.Prefill(ctx, make([]int32, 60))
		require.NoError(t, err)
		_, err = Verify(ctx, r, make([]int32, 8))
		require.ErrorIs(t, err, llm.ErrContextFull)
		assert.Equal(t, 60, r.Len(), "a refused verify changes nothing")
		r.Reset()
		_, err = Verify(ctx, r, make([]int32, 33))
		require.ErrorIs(t, err, core.ErrInvalidArgument)
		require.ErrorIs(t, r.Truncate(5), core.ErrInvalidArgument)
	})
	t.Run("no verify graphs", func(t *testing.T) {
		plainRunner, err := llm.NewRunner(ctx, m, dev, llm.WithContextLength(64))
		require.NoError(t, err)
		defer plainRunner.Close()
		_, err = plainRunner.Generate(ctx, "Tom", With(draft.NewLookup()))
		require.ErrorIs(t, err, ErrNoVerifyGraphs)
		require.ErrorIs(t, err, core.ErrInvalidArgument)
	})
	t.Run("bad verify lengths", func(t *testing.T) {
		for _, ls := range [][]int{{1}, {0}, {MaxVerifyLength + 1}, {128}} {
			_, err := llm.NewRunner(ctx, m, dev, llm.WithContextLength(64), WithVerifyLengths(ls...))
			require.ErrorIs(t, err, core.ErrInvalidArgument, "%v", ls)
		}
		_, err := llm.NewRunner(ctx, m, dev, llm.WithContextLength(512), WithVerifyLengths(MaxVerifyLength+1))
		require.ErrorIs(t, err, core.ErrInvalidArgument, "a length past MaxVerifyLength within the context")
	})
	t.Run("corrupt history store", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "task.hist")
		require.NoError(t, os.WriteFile(path, []byte("XPUHIST1 garbage"), 0o644))
		h, err := draft.OpenHistory(path, m.Config.Vocab, 0)
		require.ErrorIs(t, err, draft.ErrCorrupt)
		res, err := r.Generate(ctx, "Tom and his dog", llm.WithMaxTokens(40),
			With(draft.NewRetrieval(draft.RetrievalOptions{History: h})))
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

// fixedDrafter always drafts the same chain: drafts that are sometimes right.
type fixedDrafter struct{ chain []int32 }

func (d fixedDrafter) Propose(_ []int32, budget int) draft.Tree {
	return draft.Chain(d.chain[:min(budget, len(d.chain))])
}

func (fixedDrafter) Observe(draft.Step) {}

// TestSpecSamplingDistribution: with sampling, the tokens speculative decoding produces (each
// position's token, which verify passes choose) have plain sampling's frequencies.
func TestSpecSamplingDistribution(t *testing.T) {
	m := llmtest.Stories(t)
	ctx := context.Background()
	r := specRunner(t, m, llmtest.PluginDevices(t, "neon")[0], llm.WithContextLength(64))
	sc := sample.Config{Temperature: 1, TopK: 8}
	const runs, pos = 300, 4
	// the model's likeliest continuation is a draft often accepted, in part
	g, err := r.Generate(ctx, "Lily", llm.WithMaxTokens(pos))
	require.NoError(t, err)
	plain, spec := make([]map[int32]int, pos), make([]map[int32]int, pos)
	for i := range pos {
		plain[i], spec[i] = map[int32]int{}, map[int32]int{}
	}
	accepted := 0
	for i := range runs {
		sc.Seed = uint64(i + 1)
		a, err := r.Generate(ctx, "Lily", llm.WithMaxTokens(pos), llm.WithSampler(sc))
		require.NoError(t, err)
		sc.Seed = uint64(runs + i + 1)
		b, err := r.Generate(ctx, "Lily", llm.WithMaxTokens(pos), llm.WithSampler(sc),
			With(fixedDrafter{g.Tokens[1:]}, Always()))
		require.NoError(t, err)
		accepted += StatsOf(b).Accepted
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

// TestQuantizedKVSpeculative: speculative decoding's verify passes write and read a quantized
// cache as decoding does, and the rows an accepted draft keeps are moved with their blocks: the
// greedy text is plain decoding's, also across context shifts.
func TestQuantizedKVSpeculative(t *testing.T) {
	ctx := context.Background()
	// heads 32 wide: one Q8_0/Q4_0 block each, which a quantized KV cache needs
	m := llmtest.Synth(t, synth.Spec{Arch: "llama", Name: "kv32", Dim: 128, Layers: 3, Heads: 4, KVHeads: 2,
		FFN: 256, Vocab: 512, Context: 256, Type: core.F32, Seed: 5})
	ids := []int32{1, 40, 41, 42, 43, 40, 41, 42, 43, 40, 41}
	for _, dt := range []core.DType{core.Q8_0, core.Q4_0} {
		t.Run(dt.String(), func(t *testing.T) {
			r, err := llm.NewRunner(ctx, m, llmtest.RefDevice(t), llm.WithKVCacheType(dt), WithVerifyLengths(4, 8), llm.WithChunkSize(8), llm.WithContextLength(48))
			require.NoError(t, err)
			defer r.Close()
			// greedy, BOS and EOS biased away: only the token budget ends the text
			noEnd := sample.Config{LogitBias: map[int32]float32{1: -100, 2: -100}}
			opts := []llm.GenerateOption{llm.WithPromptTokens(ids), llm.WithMaxTokens(100), llm.WithContextShift(4), llm.WithSampler(noEnd)}
			plain, err := r.Generate(ctx, "", opts...)
			require.NoError(t, err)
			spec, err := r.Generate(ctx, "", append(opts, With(draft.NewLookup(), Always()))...)
			require.NoError(t, err)
			assert.Positive(t, StatsOf(spec).Verifies, "drafts were verified")
			assert.Len(t, plain.Tokens, 100)
			assert.Equal(t, plain.Tokens, spec.Tokens)
		})
	}
}

func specRunner(t testing.TB, m *llm.Model, dev core.Device, opts ...llm.RunnerOption) *llm.Runner {
	r, err := llm.NewRunner(context.Background(), m, dev, append([]llm.RunnerOption{WithVerifyLengths(8, 16, 32), llm.WithChunkSize(16)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// chi2Critical is the 0.999 quantile of the chi-squared distribution with df degrees of
// freedom (Wilson–Hilferty).
func chi2Critical(df int) float64 {
	k := float64(df)
	return k * math.Pow(1-2/(9*k)+3.09*math.Sqrt(2/(9*k)), 3)
}
