package llm

import "github.com/xpuhub/xpu/core"

// StageHook shapes the stage graphs a Runner builds beyond the model. A technique that
// rewrites the projections (the W8A8 lowering) implements it and reaches the runner through
// WithStageHook, so the runner names no technique: it calls BeginStage once per stage graph
// it builds (prefill chunks, decode steps, verify graphs) and asks the returned builder for
// every projection of that graph.
//
// Hooks rewrite projections, so a runner with a hook needs a llama-shaped model and does not
// combine with decode shards, a sparse FFN, calibration taps or a batch: those build the
// projections themselves.
type StageHook interface {
	// BeginStage starts one stage graph; the builder lives while that graph is built, so it
	// may share work between the graph's projections (one QUANTIZE per input).
	BeginStage() StageBuilder
}

// StageBuilder builds the projections of one stage graph for a StageHook.
type StageBuilder interface {
	// Linear returns projection proj ("attn_q", "ffn_down", ...) of layer applied to x [C, K]
	// in g, or nil to leave it to the model's MATMUL with weight blk.<layer>.<proj>.weight.
	Linear(g *core.Graph, x *core.Tensor, layer int, proj string) *core.Tensor
}

// WithStageHook shapes every stage graph the runner builds with h (nil: the model as it is).
// WithW8A8 is WithStageHook with the W8A8 lowering; the last of the two given wins.
func WithStageHook(h StageHook) RunnerOption { return func(c *runnerConfig) { c.hook = h } }
