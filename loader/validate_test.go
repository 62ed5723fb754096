package loader

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// WithValidation and XPU_VALIDATE=1 install the validation layer, in process and isolated; a
// plain open (or WithoutEnv, which ignores XPU_VALIDATE) does not. The plugin claims EXP in
// graph_analyze and refuses it at prepare: with the layer that is a broken rule, without it
// the plain unsupported status.
func TestValidationIsInstalled(t *testing.T) {
	path := plugintest.Plugin(t, "MUT_REFUSE")
	tests := []struct {
		name     string
		env      string
		opts     []Option
		validate bool
	}{
		{"off", "", []Option{WithoutEnv()}, false},
		{"option", "", []Option{WithoutEnv(), WithValidation()}, true},
		{"env", "1", nil, true},
		{"env ignored", "1", []Option{WithoutEnv()}, false},
		{"env other value", "yes", nil, false},
		{"isolated option", "", []Option{WithoutEnv(), Isolated(), WithValidation()}, true},
		{"isolated env", "1", []Option{Isolated()}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(EnvValidate, tt.env)
			t.Setenv(EnvPluginPath, "")
			t.Setenv(EnvIsolate, "")
			ctx := context.Background()
			be, err := Open(ctx, path, tt.opts...)
			require.NoError(t, err)
			defer be.Close()
			cx, err := be.Devices()[0].NewContext(ctx, nil)
			require.NoError(t, err)
			defer cx.Close()
			g := core.NewGraph()
			g.Output(g.Exp(g.Input("x", core.F32, 7)))
			_, err = cx.Prepare(ctx, g)
			require.Error(t, err)
			assert.Equal(t, tt.validate, errors.Is(err, abi.RuleAnalyzePrepare), "%v", err)
			assert.Equal(t, !tt.validate, errors.Is(err, core.ErrUnsupported), "%v", err)
		})
	}
}
