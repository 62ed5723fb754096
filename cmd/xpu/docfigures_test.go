package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docConformFigure is a conformance figure quoted in the documentation: the command in a code
// span, an arrow, and the summary line it prints in bold, e.g.
// "`xpu conform --plugin coreml` → **432 passed, 0 failed, 586 unsupported**".
var docConformFigure = regexp.MustCompile("`((?:[A-Z_]+=\\S+ )*(?:build/)?xpu conform [^`]+)`\\s*→\\s*\\*\\*(\\d+ passed, \\d+ failed, \\d+ unsupported)\\*\\*")

// docMarkdown lists the repository's Markdown files a reader takes as current (the lab notes
// are history and keep their figures as measured).
func docMarkdown(t *testing.T, root string) []string {
	var out []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (rel == "lab" || rel == "build" || strings.HasPrefix(d.Name(), ".") && rel != ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			out = append(out, p)
		}
		return nil
	}))
	return out
}

// TestDocConformanceFigures reruns every conformance figure the documentation quotes and
// compares the summary line, so that a README cannot go on quoting an older suite's counts.
func TestDocConformanceFigures(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// the quoted counts include the model cases, which run only where the test model is
	if _, err := os.Stat(filepath.Join(root, "..", "shared", "models", "stories260K.gguf")); err != nil {
		t.Skipf("../shared/models/stories260K.gguf is absent: the documented counts include its model cases (%v)", err)
	}
	bin := buildXPU(t)
	found := 0
	for _, file := range docMarkdown(t, root) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		// a figure may be wrapped over two lines
		text := strings.Join(strings.Fields(string(b)), " ")
		for _, m := range docConformFigure.FindAllStringSubmatch(text, -1) {
			found++
			rel, _ := filepath.Rel(root, file)
			line := regexp.MustCompile(`(^|\s)(build/)?xpu `).ReplaceAllString(m[1], "${1}"+bin+" ") + " --report " + t.TempDir()
			out, _ := runDocLine(t, line, nil)
			assert.Equal(t, m[2], lastLine(out), "%s quotes `%s`", rel, m[1])
		}
	}
	assert.GreaterOrEqual(t, found, 3, "the coreml and the two qnn profiles' figures")
}
