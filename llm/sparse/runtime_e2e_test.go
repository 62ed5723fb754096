package sparse

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/loader"
)

// The Runtime drives a real runner: with the oracle and a budget that keeps most neurons cold
// (so every layer reads from the sidecar while now's rows compute), sparse decoding gives dense
// decoding's greedy tokens; with the trained predictor computed in the graph, it runs and its
// counters add up. On the reference and, where it is built, the neon plugin.
func TestRuntimeRunnerMatchesDense(t *testing.T) {
	ctx := context.Background()
	m, s, path, toks := plannedF32(t, 200, 5)
	fx := FixedRegion(m, 64, core.F32, 16)
	rb := core.F32.Bytes(3 * 128)
	or, err := NewOracle(s, 0)
	require.NoError(t, err)
	prompt := toks[:11]
	devs := map[string]core.Device{"ref": ref.New().Devices()[0]}
	if be, err := loader.Open(ctx, "neon"); err == nil {
		defer be.Close()
		devs["neon"] = be.Devices()[0]
	} else {
		t.Logf("neon plugin not available (%v): reference only", err)
	}
	for name, dev := range devs {
		t.Run(name, func(t *testing.T) { runtimeMatchesDense(t, m, s, or, dev, path, prompt, fx.Total(), rb) })
	}
}

func runtimeMatchesDense(t *testing.T, m *llm.Model, s *Sidecar, or *Oracle, dev core.Device, path string, prompt []int32, fixed, rb int64) {
	ctx := context.Background()
	const ctxLen = 64

	dense, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(ctxLen))
	require.NoError(t, err)
	defer dense.Close()
	want := greedy(t, dense, prompt, 24)

	// A budget of the fixed region, the I/O buffer and 1.5 layers' neurons: a few hot rows and
	// a cold cache smaller than the model's FFN.
	budget := fixed + 4*stagingSize(1<<20, rb) + 3*384/2*rb
	byName := map[string][]int32{}
	for _, tc := range []struct {
		name   string
		budget int64 // 0: the sidecar's (fixed + 200 rows: below one layer's neurons, bounded)
		opts   []RuntimeOption
	}{
		{"oracle", budget, []RuntimeOption{WithPredictor(or), WithRecallSampling(3)}},
		{"oracle/lfu/buffered", budget, []RuntimeOption{WithPredictor(or), WithEviction(EvictLeastFrequent), WithBufferedIO()}},
		{"trained", budget, []RuntimeOption{WithRecallSampling(1)}},
		{"trained/no look-ahead", budget, []RuntimeOption{WithPrefetch(false)}},
		{"trained/sidecar budget", 0, nil},
		{"oracle/all resident", 1 << 40, []RuntimeOption{WithPredictor(or)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The budget above holds four readers' buffers.
			rt, err := NewRuntime(ctx, m, s, path, append([]RuntimeOption{WithContext(ctxLen, core.F32), WithBudget(tc.budget), WithReaders(4)}, tc.opts...)...)
			require.NoError(t, err)
			defer rt.Close()
			sp, err := llm.NewRunner(ctx, m, dev, llm.WithChunkSize(4), llm.WithContextLength(ctxLen), WithFFN(rt))
			require.NoError(t, err)
			defer sp.Close()
			logits, err := sp.Prefill(ctx, prompt)
			require.NoError(t, err)
			var got []int32
			for range 24 {
				tok := int32(slices.Index(logits, slices.Max(logits)))
				got = append(got, tok)
				logits, err = sp.Decode(ctx, tok)
				require.NoError(t, err)
			}
			st := rt.Stats()
			t.Logf("%s\n%s", tc.name, st)
			assert.Equal(t, tc.budget == 1<<40, rt.Layout().AllResident, "one FFN graph fewer per layer exactly when nothing is ever read")
			if tc.budget == 1<<40 {
				assert.Zero(t, st.ColdSlots+st.ColdMisses+st.BytesRead, "a budget that holds every neuron reads nothing per token: %s", st)
				assert.Equal(t, st.Selected, st.HotRows)
			} else {
				assert.Positive(t, st.ColdMisses, "the budget keeps most neurons cold")
				assert.Positive(t, st.ColdHits)
			}
			assert.Equal(t, st.Selected, st.HotRows+st.ColdHits+st.ColdMisses+st.Dropped)
			assert.Equal(t, int64(11+24), st.Tokens, "11 prompt tokens (the runner hands Select no padding rows), 24 decoded")
			assert.Equal(t, tc.budget == 0, st.Bounded)
			if tc.name == "trained" {
				assert.Positive(t, st.Recall)
				// The look-ahead's logits come from the runner's graphs: the host never
				// decodes the predictors.
				assert.True(t, rt.Layout().LookAhead)
				assert.Positive(t, st.PrefetchRows)
				assert.Nil(t, rt.trained, "host copy of the predictors")
			}
			// The look-ahead changes where rows are read and when, never which rows a layer
			// uses: greedy decoding is the same with it and without.
			byName[tc.name] = got
			// (TestRuntimePrefetch checks that it reads what it should.)
			if tc.name == "trained/no look-ahead" {
				assert.Zero(t, st.PrefetchRows)
				assert.Equal(t, byName["trained"], got)
			}
			if strings.HasPrefix(tc.name, "trained") {
				return
			}
			assert.Equal(t, want, got)
			if st.RecallSamples > 0 {
				assert.Equal(t, 1.0, st.Recall)
			}
		})
	}
}
