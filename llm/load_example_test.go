package llm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
)

// writeTinyModel writes a small synthetic Llama GGUF (seeded random weights: the text is
// gibberish, but every step is the real one) so that the examples run where the test model
// (../shared/models/stories260K.gguf, which TestLoadStories uses) is absent. Its greedy output
// on the reference backend is deterministic, so the examples can show it.
func writeTinyModel() (path string, cleanup func()) {
	dir, err := os.MkdirTemp("", "xpu-example")
	if err != nil {
		log.Fatal(err)
	}
	path = filepath.Join(dir, "tiny.gguf")
	spec, _ := synth.Preset("llama", "260K", core.Q8_0, 42)
	if err := synth.WriteFile(path, spec); err != nil {
		log.Fatal(err)
	}
	return path, func() { os.RemoveAll(dir) }
}

// Load opens a model, chooses the device and prepares the model on it. Without WithBackend it
// takes the fastest usable device (sched.MaxPerformance order, never the float64 reference);
// the example names "ref" so that its output is the same on every machine.
func ExampleLoad() {
	path, cleanup := writeTinyModel()
	defer cleanup()

	ctx := context.Background()
	eng, err := llm.Load(ctx, path, llm.WithBackend("ref"))
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()
	res, err := eng.Generate(ctx, "Once upon a time", llm.WithMaxTokens(8))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("device:", eng.Device().Info().ID())
	fmt.Println("prompt tokens:", res.PromptTokens, "generated:", len(res.Tokens), "stop:", res.Stop)
	// Output:
	// device: ref:0
	// prompt tokens: 13 generated: 8 stop: max-tokens
}

// A chat keeps the conversation and the KV cache between turns; the prompt is the model's
// tokenizer.chat_template (this synthetic model has none, so FallbackChatTemplate renders it).
func ExampleEngine_NewChat() {
	path, cleanup := writeTinyModel()
	defer cleanup()

	ctx := context.Background()
	eng, err := llm.Load(ctx, path, llm.WithBackend("ref"))
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()
	chat, err := eng.NewChat(llm.WithSystemPrompt("You tell short stories."))
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range []string{"Tell me about a cat.", "And a dog?"} {
		if _, err := chat.Send(ctx, q, llm.WithMaxTokens(4)); err != nil {
			log.Fatal(err)
		}
	}
	for _, m := range chat.Messages() {
		if m.Role != "assistant" {
			fmt.Printf("%s: %s\n", m.Role, m.Content)
		}
	}
	fmt.Println("fallback template:", chat.Template().IsFallback())
	// Output:
	// system: You tell short stories.
	// user: Tell me about a cat.
	// user: And a dog?
	// fallback template: true
}
