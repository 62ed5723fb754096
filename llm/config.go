package llm

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Config is a decoder-only transformer's shape, read from GGUF metadata (arch.Config).
type Config = arch.Config

// Activation is an FFN gate activation (arch.Activation).
type Activation = arch.Activation

// The FFN activations the runtime builds (arch's).
const (
	ActSiLU  = arch.ActSiLU
	ActReLU  = arch.ActReLU
	ActReLU2 = arch.ActReLU2
	ActGELU  = arch.ActGELU
)

// ActivationKey is the GGUF metadata key, after "<arch>.", that names the FFN activation.
const ActivationKey = arch.ActivationKey

// ParseActivation reads an activation name; an unknown one is an error naming the choices.
func ParseActivation(s string) (Activation, error) { return arch.ParseActivation(s) }

// ConfigFromGGUF reads the hyperparameters; a missing key or an unknown architecture is an
// error naming it.
func ConfigFromGGUF(f *gguf.File) (Config, error) { return arch.ConfigFromGGUF(f) }

// Architectures lists the general.architecture values xpu loads, sorted.
func Architectures() []string { return arch.Architectures() }

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
