package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
)

// Config is a decoder-only transformer's shape, read from GGUF metadata (arch.Config).
type Config = arch.Config

// ErrArchFeature: a technique (decode shards, the sparse FFN, W8A8 weights) builds Llama-shaped
// layers itself and the model's architecture is not.
var ErrArchFeature = fmt.Errorf("llm: the technique builds Llama-shaped layers: %w", core.ErrUnsupported)

// RequireLlamaShape refuses, with ErrArchFeature, a technique that builds its own Llama-shaped
// layers (named by technique) for a model whose layers are not.
func (m *Model) RequireLlamaShape(technique string) error {
	if m.arch.Plain() && m.Config.SlidingWindow == 0 && m.Config.HeadDim*m.Config.Heads == m.Config.Dim {
		return nil
	}
	return fmt.Errorf("%w: %s on %s", ErrArchFeature, technique, m.Config.Arch)
}
