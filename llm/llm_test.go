package llm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// modelsDir is ../shared/models relative to the repository root.
func modelsDir(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "shared", "models")
	if _, err := os.Stat(filepath.Join(dir, "stories260K.gguf")); err != nil {
		t.Skipf("test models absent (%s): %v", dir, err)
	}
	return dir
}

func refDevice(t testing.TB) core.Device {
	b := ref.New()
	t.Cleanup(func() { _ = b.Close() })
	return b.Devices()[0]
}

func openStories(t testing.TB) *Model {
	m, err := Open(filepath.Join(modelsDir(t), "stories260K.gguf"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestStoriesGreedy(t *testing.T) {
	m := openStories(t)
	want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
	require.NoError(t, err)
	r, err := NewRunner(context.Background(), m, refDevice(t))
	require.NoError(t, err)
	defer r.Close()
	res, err := r.Generate(context.Background(), "", WithMaxTokens(256))
	require.NoError(t, err)
	require.Equal(t, StopMaxTokens, res.Stop)
	require.Len(t, res.Tokens, 256)
	// The published sample is a text file: the generated text plus a final newline.
	require.Equal(t, strings.TrimSuffix(string(want), "\n"), res.Text)
}
