package llm

import "github.com/xpuhub/xpu/core"

// ProjectionHook lowers the projections of the stage graphs a Runner builds. A technique
// that rewrites them (the W8A8 lowering) implements it and reaches the runner through
// WithProjectionHook, so the runner names no technique: it calls BeginStage once per stage
// graph it builds (prefill chunks, decode steps, verify graphs) and asks the returned builder
// for every projection of that graph. It is finer than the runner's program-level stage hook
// (stagehook.go), which replaces whole stage graphs.
//
// A runner with a projection hook needs a llama-shaped model and does not combine with decode
// shards, a sparse FFN, a batch or an embedder: those build their projections themselves.
type ProjectionHook interface {
	// BeginStage starts one stage graph; the builder lives while that graph is built, so it
	// may share work between the graph's projections (one QUANTIZE per input).
	BeginStage() ProjectionBuilder
}

// ProjectionBuilder builds the projections of one stage graph for a ProjectionHook.
type ProjectionBuilder interface {
	// Linear returns projection proj ("attn_q", "ffn_down", ...) of layer applied to x [C, K]
	// in g, or nil to leave it to the model's MATMUL with weight blk.<layer>.<proj>.weight.
	Linear(g *core.Graph, x *core.Tensor, layer int, proj string) *core.Tensor
}

// ProjectionReader is a ProjectionBuilder that also reads tensors of its stage graph back after
// every run: what a calibration measures activation ranges with (w8a8.Calibrate builds the
// model's own projections and reads back their inputs and outputs).
type ProjectionReader interface {
	ProjectionBuilder
	// ReadBack lists the F32 tensors to read back; once the stage graph is built the runner makes
	// them its outputs, after the stage's own.
	ReadBack() []*core.Tensor
	// Read is handed the bytes of ReadBack's tensor i (one row per token of the chunk) after
	// each run, on the caller's goroutine before the run returns; it must not keep data. An
	// error fails the run.
	Read(i int, data []byte) error
}

// WithProjectionHook lowers the projections of every stage graph the runner builds with h
// (nil: the model's projections as they are). w8a8.WithLowering is WithProjectionHook with the
// W8A8 lowering; the last hook given wins.
func WithProjectionHook(h ProjectionHook) RunnerOption { return func(c *runnerConfig) { c.proj = h } }
