// Package llmtest holds what the tests of the LLM packages share: the test models in
// ../shared/models (skipping clearly where they are absent), the reference device and plugin
// devices (skipping through internal/required where a plugin is not built). It sits above llm
// in the layering, as a test's own code would.
package llmtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/loader"
)

// ModelsDir is ../shared/models beside the repository root; it skips t when the test models
// are absent.
func ModelsDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(modroot.Find(), "..", "shared", "models")
	if _, err := os.Stat(filepath.Join(dir, "stories260K.gguf")); err != nil {
		t.Skipf("test models absent (%s): %v", dir, err)
	}
	return dir
}

// Stories opens stories260K, closed when t ends.
func Stories(t testing.TB) *llm.Model {
	t.Helper()
	m, err := llm.Open(filepath.Join(ModelsDir(t), "stories260K.gguf"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// RefDevice is the reference backend's device, closed when t ends.
func RefDevice(t testing.TB) core.Device {
	b := ref.New()
	t.Cleanup(func() { _ = b.Close() })
	return b.Devices()[0]
}

// PluginDevices opens the named plugins (built by make all) and lists their devices; a plugin
// that does not open skips t through required.Skip.
func PluginDevices(t testing.TB, names ...string) []core.Device {
	t.Helper()
	var devs []core.Device
	for _, n := range names {
		b, err := loader.Open(context.Background(), n)
		if err != nil {
			required.Skip(t, n, "backend %s not available (run make all): %v", n, err)
		}
		t.Cleanup(func() { _ = b.Close() })
		devs = append(devs, b.Devices()...)
	}
	return devs
}

// Synth writes the generated model s to a file and maps it, as a real one is; closed when t
// ends.
func Synth(t testing.TB, s synth.Spec) *llm.Model {
	t.Helper()
	path := filepath.Join(t.TempDir(), s.Name+".gguf")
	require.NoError(t, synth.WriteFile(path, s))
	m, err := llm.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}
