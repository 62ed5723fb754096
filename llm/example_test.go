package llm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/sample"
	"github.com/xpuhub/xpu/llm/synth"
)

// An app opens a GGUF model, picks a device (here the built-in reference; loader.Open("neon")
// gives a plugin's) and generates, receiving the text as it streams. The model here is a small
// synthetic one so that the example runs anywhere; a real one is opened the same way.
func Example() {
	dir, err := os.MkdirTemp("", "xpu-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tiny.gguf")
	spec, _ := synth.Preset("llama", "260K", core.Q8_0, 42)
	if err := synth.WriteFile(path, spec); err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	m, err := llm.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	backend := ref.New()
	defer backend.Close()
	r, err := llm.NewRunner(ctx, m, backend.Devices()[0], llm.WithChunkSize(16))
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	var streamed int
	res, err := r.Generate(ctx, "Once upon a time",
		llm.WithMaxTokens(16),
		llm.WithSampler(sample.Config{Temperature: 0.8, TopP: 0.95, Seed: 1}),
		llm.WithStream(func(text string) error { streamed += len(text); return nil }))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("architecture:", m.Config.Arch, "layers:", m.Config.Layers)
	fmt.Println("prompt tokens:", res.PromptTokens)
	fmt.Println("streamed all of the text:", streamed == len(res.Text))
	// Output:
	// architecture: llama layers: 5
	// prompt tokens: 13
	// streamed all of the text: true
}
