package spec_test

import (
	"context"
	"fmt"
	"log"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/spec"
	"github.com/xpuhub/xpu/llm/synth"
)

// Speculative decoding: the runner prepares verify graphs, and Generate drafts from text the
// model has seen (here the retrieval drafter: the prompt, the output so far and the model's
// prefill predictions), verifying each draft in one pass. Greedy output is plain decoding's.
func ExampleWith() {
	// a small synthetic model, parsed from memory: a real one is opened with llm.Open
	tiny, _ := synth.Preset("llama", "260K", core.F32, 42)
	f, err := synth.Parse(tiny)
	if err != nil {
		log.Fatal(err)
	}
	m, err := llm.FromFile(f)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	backend := ref.New()
	defer backend.Close()
	r, err := llm.NewRunner(ctx, m, backend.Devices()[0], spec.WithVerifyLengths(8, 16))
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	plain, err := r.Generate(ctx, "Once upon a time", llm.WithMaxTokens(24))
	if err != nil {
		log.Fatal(err)
	}
	res, err := r.Generate(ctx, "Once upon a time", llm.WithMaxTokens(24),
		spec.With(draft.NewRetrieval(draft.RetrievalOptions{}), spec.Always()))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("same text as plain decoding:", res.Text == plain.Text)
	fmt.Println("tokens per pass at least 1:", spec.StatsOf(res).TokensPerPass() >= 1)
	// Output:
	// same text as plain decoding: true
	// tokens per pass at least 1: true
}
