package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/modroot"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// docs/ops.md is what `make ops-doc` makes of today's backends: a plugin that starts or stops
// supporting an op × dtype must come with the regenerated file.
func TestOpsDocIsCurrent(t *testing.T) {
	ctx := context.Background()
	for _, name := range opsDocBackends {
		b, err := loader.Open(ctx, name)
		if err != nil {
			required.Skip(t, name, "backend %s cannot be opened here (run make plugins): %v", name, err)
			return
		}
		require.NoError(t, b.Close())
	}
	path := filepath.Join(t.TempDir(), "ops.md")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"conform", "--ops-doc", path}, &out, &errb), errb.String())
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	want, err := os.ReadFile(filepath.Join(modroot.Find(), "docs", "ops.md"))
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "docs/ops.md is stale: run `make ops-doc`")
	for _, name := range opsDocBackends {
		assert.Contains(t, string(got), " "+name+" |", "a column per in-tree backend")
	}
	assert.Contains(t, string(got), "| MATMUL | f32/q4_0 | yes |", "neon's quantized MATMUL")
}

// --ops-doc refuses a backend it cannot open rather than leave its column out.
func TestOpsDocNeedsEveryBackend(t *testing.T) {
	var out, errb bytes.Buffer
	rc := run([]string{"conform", "--ops-doc", "-", "--plugin", "ref", "--plugin", filepath.Join(t.TempDir(), "libxpu-none.so")}, &out, &errb)
	assert.Equal(t, 1, rc)
	assert.Contains(t, errb.String(), "libxpu-none.so")
	assert.Empty(t, out.String())
}
