package abi

import (
	"context"
	"testing"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// BenchmarkCallOverhead is the host's cost of the calls a scheduler makes per task: a Bind
// of one input and a Run of a 4-element graph on the test plugin (whose own work is a few
// ns), so ns/op is purego's and the adapter's overhead of two calls:
//
//	go test ./abi -run X -bench CallOverhead
func BenchmarkCallOverhead(b *testing.B) { benchCallOverhead(b) }

// BenchmarkCallOverheadValidated is BenchmarkCallOverhead with the validation layer on.
func BenchmarkCallOverheadValidated(b *testing.B) { benchCallOverhead(b, WithValidation()) }

func benchCallOverhead(b *testing.B, opts ...BackendOption) {
	p, err := Open(plugintest.Plugin(b))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	be, err := NewBackend(p, opts...)
	if err != nil {
		b.Fatal(err)
	}
	cx, err := be.Devices()[0].NewContext(context.Background(), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cx.Close()
	g := core.NewGraph()
	g.Output(g.ReLU(g.Input("x", core.F32, 4)))
	exe, err := cx.Prepare(context.Background(), g)
	if err != nil {
		b.Fatal(err)
	}
	defer exe.Close()
	in, err := cx.Alloc(32, core.BufferDevice)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	out, err := cx.Alloc(16, core.BufferDevice)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	ex, err := exe.NewExecution()
	if err != nil {
		b.Fatal(err)
	}
	defer ex.Close()
	if err := ex.Bind(1, out, 0); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		if err := ex.Bind(0, in, 16*(i&1)); err != nil { // the row moves, as a KV write's does
			b.Fatal(err)
		}
		if err := ex.Run(ctx); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
