package neon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// findPlugins lists the NEON builds to test: the files in XPU_PLUGIN_PATH (the arm64 run under
// qemu sets it) or else every libxpu-neon*.so in build/plugins, each variant on its own.
func findPlugins() (files, searched []string) {
	if env := os.Getenv(loader.EnvPluginPath); env != "" {
		searched = strings.Split(env, ":")
	} else {
		searched = []string{filepath.Join("..", "..", "build", "plugins")}
	}
	for _, d := range searched {
		if st, err := os.Stat(d); err == nil && !st.IsDir() {
			if strings.HasPrefix(filepath.Base(d), "libxpu-neon") {
				files = append(files, d)
			}
			continue
		}
		m, _ := filepath.Glob(filepath.Join(d, "libxpu-neon*.so"))
		files = append(files, m...)
	}
	return files, searched
}

// pluginFiles is findPlugins, skipping the test when there is no build.
func pluginFiles(t testing.TB) []string {
	t.Helper()
	files, searched := findPlugins()
	if len(files) == 0 {
		required.Skip(t, "neon", "no libxpu-neon*.so in %v: run `make plugins` first", searched)
	}
	return files
}

// openUsable opens path, or skips when this build cannot run on this CPU (an AVX2 build on a
// CPU without AVX2 probes 0).
func openUsable(t *testing.T, path string) core.Backend {
	t.Helper()
	b, err := loader.Open(context.Background(), path)
	if errors.Is(err, core.ErrUnsupported) {
		// not a missing backend: this build of neon needs CPU features this machine lacks, and
		// neonPlugins' other builds (the portable one) still run
		t.Skipf("%s does not run here: %v", path, err)
	}
	require.NoError(t, err, path)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestDevice(t *testing.T) {
	for _, f := range pluginFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b := openUsable(t, f)
			require.Equal(t, "neon", b.Info().Name)
			devs := b.Devices()
			require.Len(t, devs, 1)
			info := devs[0].Info()
			require.Equal(t, core.DeviceCPU, info.Kind)
			require.True(t, info.Caps.Has(core.CapImportHost|core.CapHostVisible|core.CapConcurrent|core.CapAsync))
			require.False(t, info.Caps.Has(core.CapFP16), "f16 is computed in f32 here: the cap would be a lie")
			require.Positive(t, info.ComputeUnits)
			if runtime.GOARCH == "amd64" {
				require.False(t, info.Caps.Has(core.CapInt8), "no native int8 dot product is claimed on x86-64")
			}
		})
	}
}

// TestConformance runs the whole conformance suite, ABI cases included, on every build (under
// -race or -short on the first; `make test` runs `xpu conform` on each build besides) and wants
// zero failures and the whole op set run: a suite that quietly stops running cases (every one
// unsupported, or filtered away) must not pass.
func TestConformance(t *testing.T) {
	files := pluginFiles(t)
	if raceEnabled || testing.Short() {
		files = files[:1]
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b := openUsable(t, f)
			rep, err := conformance.Run(context.Background(), b, conformance.WithPlugin(abi.PluginOf(b)))
			require.NoError(t, err)
			t.Log(rep.Summary())
			for _, c := range rep.Failures() {
				t.Errorf("%s [%s]: %s", c.Name, c.Category, strings.Join(c.Errors, "; "))
			}
			assert.Zero(t, rep.Failed)
			// the whole op set except QUANTIZE to a K-quant, which OPS.md lets a backend refuse
			// (the K-quants' scale search runs at model conversion, not in a graph)
			var unsupported []string
			for _, c := range rep.Cases {
				if c.Status == conformance.StatusUnsupported &&
					!(strings.HasPrefix(c.Name, "QUANTIZE") && strings.Contains(c.Name, "_k")) {
					unsupported = append(unsupported, c.Name)
				}
			}
			assert.Empty(t, unsupported, "the neon plugin implements the whole op set but QUANTIZE to K-quants")
			assert.LessOrEqual(t, rep.Unsupported, 20, "only the 20 QUANTIZE-to-K-quant cases may be unsupported")
			assert.Greater(t, rep.Passed, 600, "the whole suite should run (633 cases when this was written)")
		})
	}
}
