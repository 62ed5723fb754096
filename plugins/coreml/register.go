package coreml

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// importing the package makes "coreml" a backend name (core.OpenBackend, --backend coreml); its
// compute units are the "units" setting (xpu's --coreml-units), handed to New through EnvUnits
// so that a plugin host child process inherits them
func init() {
	core.Register(core.BuiltIn{
		Name:     Name,
		Open:     func(context.Context) (core.Backend, error) { return New() },
		Probe:    Probe,
		Settings: []core.Setting{{Key: "units", Values: Units, Default: "all", Doc: "Core ML compute units"}},
		Set: func(key, value string) error {
			if key != "units" || !slices.Contains(Units, value) {
				return fmt.Errorf("coreml: setting %s=%q: %w", key, value, core.ErrInvalidArgument)
			}
			return os.Setenv(EnvUnits, value)
		},
	})
}
