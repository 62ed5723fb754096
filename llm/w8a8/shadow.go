package w8a8

import (
	"fmt"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// ShadowMode says which layers run mllm-NPU's shadow outlier path.
type ShadowMode int

const (
	// ShadowOff: plain per-tensor W8A8; activations beyond the threshold are clipped.
	ShadowOff ShadowMode = iota
	// ShadowOn: every layer adds the float product of its outliers in hot channels.
	ShadowOn
	// ShadowPruned: only the layers the calibration kept (its most important ones) do.
	ShadowPruned
)

var shadowNames = []string{"off", "on", "pruned"}

// String is the mode as ParseShadowMode reads it.
func (s ShadowMode) String() string {
	if s >= 0 && int(s) < len(shadowNames) {
		return shadowNames[s]
	}
	return fmt.Sprintf("ShadowMode(%d)", int(s))
}

// ParseShadowMode reads "off", "on" or "pruned".
func ParseShadowMode(s string) (ShadowMode, error) {
	if i := slices.Index(shadowNames, s); i >= 0 {
		return ShadowMode(i), nil
	}
	return 0, fmt.Errorf("w8a8: shadow mode %q (off, on, pruned): %w", s, core.ErrInvalidArgument)
}

// Config says how NewLowering lowers a model to W8A8.
type Config struct {
	// Calibration is the model's (xpu calibrate); required.
	Calibration *Calibration
	// Shadow selects the layers with a shadow path.
	Shadow ShadowMode
	// Convert quantizes the weights at load time when the file has no NPU int8 tensors (xpu
	// quantize --npu-int8 writes them ahead of time); without it such a file is an error
	// wrapping ErrNoInt8.
	Convert bool
	// Granularity of the weights converted at load time.
	Granularity Granularity
	// ShadowLayers, if not nil, overrides Shadow: exactly these layers run the shadow path
	// (calibration measures each layer's importance this way).
	ShadowLayers []bool
}
