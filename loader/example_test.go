package loader_test

import (
	"context"
	"fmt"
	"log"

	"github.com/xpuhub/xpu/loader"
)

// Discover lists every plugin candidate with its probe score or the reason it was rejected;
// OpenAll opens the best build of each backend that can run here.
func Example() {
	ctx := context.Background()
	cands, err := loader.Discover(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range cands {
		if !c.Chosen {
			fmt.Printf("skipped %s: %s\n", c.Path, c.Reason)
		}
	}
	backends, _, err := loader.OpenAll(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range backends {
		for _, d := range b.Devices() {
			fmt.Println(d.Info().ID(), d.Info().Kind, d.Info().Caps)
		}
		b.Close()
	}

	// The reference backend is always there.
	ref, err := loader.Open(ctx, loader.RefName)
	if err != nil {
		log.Fatal(err)
	}
	defer ref.Close()
	fmt.Println(ref.Devices()[0].Info().ID())
}

// A Go application that opens backends isolated calls ServeIfPluginHost first thing in main:
// the loader starts the application's own executable as the plugin host, and there this call
// serves the plugin and exits; in the application it returns at once.
func ExampleServeIfPluginHost() {
	loader.ServeIfPluginHost()

	ctx := context.Background()
	b, err := loader.Open(ctx, loader.RefName, loader.Isolated()) // "neon", "qnn", a path...
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	fmt.Println(b.Info().Name)
	// Output: ref
}
