package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layers ranks the module's packages, lowest first, as README's Layout states them: a package
// imports packages of its own layer or below, never above. The longest matching prefix wins.
var layers = []struct {
	prefix string
	rank   int
}{
	{"core", 0}, {"internal/", 0},
	{"core/ref", 1},
	{"abi", 2}, {"kernelbench", 2},
	{"loader", 3}, {"plugins/", 3}, {"conformance", 3},
	{"sched", 4},
	{"llm", 5},
	{"llm/serve", 6},
	{"cmd/", 7}, {"examples/", 7}, {"bench", 7}, {"lab/", 7}, {"internal/llmtest", 7},
}

func layerOf(pkg string) (int, bool) {
	best, rank := -1, 0
	for _, l := range layers {
		if (pkg == strings.TrimSuffix(l.prefix, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(l.prefix, "/")+"/")) &&
			len(l.prefix) > best {
			best, rank = len(l.prefix), l.rank
		}
	}
	return rank, best >= 0
}

// TestLayering: no package imports one above it, and the LLM runtime reaches backends through
// core's registry only (it does not import the loader).
func TestLayering(t *testing.T) {
	root := filepath.Join("..", "..")
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err)
	const mod = "github.com/xpuhub/xpu/"
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		rank, ok := layerOf(pkg)
		require.True(t, ok, "package %s has no layer: add it to layers and to README's Layout", pkg)
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			depRank, ok := layerOf(dep)
			require.True(t, ok, "package %s has no layer", dep)
			assert.LessOrEqual(t, depRank, rank, "%s (layer %d) imports %s (layer %d), a layer above it", pkg, rank, dep, depRank)
			if strings.HasPrefix(pkg, "llm") {
				assert.NotEqual(t, "loader", dep, "%s imports the loader: the LLM runtime opens backends through core's registry", pkg)
			}
			checked++
		}
	}
	assert.Greater(t, checked, 50, "go list reported the module's imports")
	for _, tc := range []struct {
		pkg  string
		rank int
	}{{"core", 0}, {"core/ref", 1}, {"internal/futex", 0}, {"llm/serve", 6}, {"llm/gguf", 5}, {"sched/solve", 4}, {"cmd/xpu", 7}} {
		r, ok := layerOf(tc.pkg)
		assert.True(t, ok)
		assert.Equal(t, tc.rank, r, tc.pkg)
	}
}

// TestEveryPackageSaysWhatItHolds: every package of the module has a package doc, and it opens
// as Go's convention has it ("Package name ..." or, for a program, "Command name ..." or the
// program's own name).
func TestEveryPackageSaysWhatItHolds(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{.Name}}|{{.Doc}}", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Greater(t, len(lines), 30)
	for _, line := range lines {
		f := strings.SplitN(line, "|", 3)
		require.Len(t, f, 3, line)
		path, name, doc := f[0], f[1], f[2]
		if !assert.NotEmpty(t, doc, "%s has no package doc", path) {
			continue
		}
		if name == "main" {
			base := filepath.Base(path)
			assert.True(t, strings.HasPrefix(doc, "Command "+base) || strings.HasPrefix(strings.ToLower(doc), base),
				"%s: a command's doc starts with \"Command %s\": %q", path, base, doc)
			continue
		}
		assert.True(t, strings.HasPrefix(doc, "Package "+name+" "), "%s: doc starts with \"Package %s \": %q", path, name, doc)
	}
}
