package llm_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/spec"
	"github.com/xpuhub/xpu/sched"
)

// TestSpecKVRowsEqualPlain: after verifies that accept part of each draft and roll the rest
// back, the cache rows of the accepted path are plain decoding's, on every backend and when
// the cache is shared between units.
func TestSpecKVRowsEqualPlain(t *testing.T) {
	m := llmtest.Stories(t)
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
			open := func() *llm.Runner {
				// an F32 cache: a verify's K differs from a decode step's in the last bits, which
				// an F16 cache can round a whole half-precision step apart (4e-3 at 5)
				opts := []llm.RunnerOption{spec.WithVerifyLengths(8, 16), llm.WithChunkSize(8), llm.WithContextLength(128), llm.WithKVCacheType(core.F32)}
				var r *llm.Runner
				var err error
				if s.backends == nil {
					r, err = llm.NewRunner(ctx, m, llmtest.RefDevice(t), opts...)
				} else {
					plan, perr := sched.ParsePlan([]byte(s.plan))
					require.NoError(t, perr)
					r, err = llm.NewPlannedRunner(ctx, m, llmtest.PluginDevices(t, s.backends...), plan, opts...)
				}
				require.NoError(t, err)
				t.Cleanup(func() { _ = r.Close() })
				return r
			}
			plain := open()
			logits, err := plain.Prefill(ctx, ids)
			require.NoError(t, err)
			var toks []int32
			for range n {
				tok := sample.Argmax(logits)
				toks = append(toks, tok)
				logits, err = plain.Decode(ctx, tok)
				require.NoError(t, err)
			}
			want := llm.KVRows(plain, len(ids)+n)

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
				if spec.TreeVerify(r) && len(chain) > 7 {
					chain = chain[:7] // 2+2·6 tree nodes and the root fit the 16-token graph
				}
				if !spec.TreeVerify(r) {
					rows, err := spec.Verify(ctx, r, chain)
					require.NoError(t, err)
					acc := 0
					for acc+1 < len(chain) && sample.Argmax(rows[acc]) == chain[acc+1] {
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
				rows, err := spec.VerifyTree(ctx, r, chain[0], tree)
				require.NoError(t, err)
				keep, cur := []int{0}, -1
				for {
					pred, next := sample.Argmax(rows[cur+1]), -1
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
				require.NoError(t, spec.KeepPath(ctx, r, base, keep))
				require.Equal(t, base+len(keep), r.Len())
				done += len(keep)
			}
			if s.tree {
				require.True(t, spec.TreeVerify(r), "the tree path ran")
			}
			require.Equal(t, append(append([]int32(nil), ids...), toks...), r.Tokens()[:len(ids)+n])
			got := llm.KVRows(r, len(ids)+n)
			for i := range want {
				require.InDeltaSlice(t, want[i], got[i], 2e-3, "layer %d %s", i/2, []string{"K", "V"}[i%2])
			}
		})
	}
}
