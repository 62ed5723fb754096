package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/modroot"
)

// TestMakeDefaultGoalBuildsTheCLI: plain `make` is what the README tells a newcomer to run; it
// must build build/xpu, not only the first rule an included plugin.mk happens to define.
func TestMakeDefaultGoalBuildsTheCLI(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make not installed")
	}
	root := modroot.Find()
	require.NotEmpty(t, root)
	// -n prints what would run without running it; -B makes every target look out of date
	out, err := exec.Command(makeBin, "-C", root, "-n", "-B").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "./cmd/xpu", "plain make must build the CLI")
	assert.Contains(t, string(out), "libxpu-neon.so", "and the plugins")
}

// TestReadmeGoVersionMatchesGoMod: the README's minimum Go is the one go.mod demands.
func TestReadmeGoVersionMatchesGoMod(t *testing.T) {
	root := modroot.Find()
	require.NotEmpty(t, root)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindSubmatch(mod)
	require.NotNil(t, m, "go.mod has no go line")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	r := regexp.MustCompile(`Go (\d+)\.(\d+) or later`).FindSubmatch(readme)
	require.NotNil(t, r, "README names no minimum Go version")
	assert.Equal(t, string(m[1])+"."+string(m[2]), string(r[1])+"."+string(r[2]),
		"README's minimum Go and go.mod's go line disagree")
}
