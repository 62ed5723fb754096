package modroot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFind(t *testing.T) {
	root := Find()
	require.NotEmpty(t, root, "the test runs inside the module")
	assert.FileExists(t, filepath.Join(root, "go.mod"))
	assert.FileExists(t, filepath.Join(root, "internal", "modroot", "modroot.go"))

	outside := t.TempDir()
	deep := filepath.Join(outside, "a", "b")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	t.Chdir(deep)
	assert.Empty(t, Find(), "no go.mod above a temp folder")
	require.NoError(t, os.WriteFile(filepath.Join(outside, "go.mod"), []byte("module x\n"), 0o644))
	got, err := filepath.EvalSymlinks(Find())
	require.NoError(t, err)
	want, err := filepath.EvalSymlinks(outside)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}
