package loader

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WithLogger receives discovery's lines instead of slog.Default, which gets none of them.
func TestWithLogger(t *testing.T) {
	var mine, def bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	log := slog.New(slog.NewTextHandler(&mine, &slog.HandlerOptions{Level: slog.LevelDebug}))

	bogus := filepath.Join(t.TempDir(), "libxpu-bogus.so")
	require.NoError(t, os.WriteFile(bogus, []byte("not a library"), 0o644))
	cands, err := Discover(context.Background(), WithoutEnv(), WithoutDefaultDirs(), WithPaths(bogus), WithLogger(log))
	require.NoError(t, err)
	require.Len(t, cands, 1)
	assert.Contains(t, mine.String(), "loader: candidate")
	assert.Contains(t, mine.String(), "libxpu-bogus.so")
	assert.Empty(t, def.String(), "nothing reaches the default logger")
}
