// Command generate is the README's Go example: text from a GGUF model on the fastest usable
// device. Run it from the repository root (plugins are found in build/plugins):
//
//	go run ./examples/generate ../shared/models/stories260K.gguf
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/xpuhub/xpu/llm"
	// the plugin backends (neon, opencl, qnn) that discovery finds, as database/sql drivers are
	// imported; import github.com/xpuhub/xpu/plugins/builtin too for the built-in Core ML backend
	_ "github.com/xpuhub/xpu/loader"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: generate MODEL.gguf")
	}
	model := os.Args[1]
	ctx := context.Background()
	eng, err := llm.Load(ctx, model) // the fastest usable device; llm.WithBackend("neon") names one
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()
	_, err = eng.Generate(ctx, "Once upon a time", llm.WithMaxTokens(64),
		llm.WithStream(func(text string) error { fmt.Print(text); return nil }))
	if err != nil {
		log.Fatal(err)
	}
}
