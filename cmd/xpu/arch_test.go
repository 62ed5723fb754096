package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/models.md's architecture lines: gen-model writes every architecture and xpu run
// generates from them, on the default device and on the reference backend.
func TestDocArchCommands(t *testing.T) {
	archLine := regexp.MustCompile(`/tmp/(\$a|[a-z0-9]+)-6m\.gguf`)
	var lines []string
	for _, l := range docShellLines(t) {
		if l.File == filepath.Join("docs", "models.md") && archLine.MatchString(l.Text) {
			lines = append(lines, l.Text)
		}
	}
	require.Len(t, lines, 3, "the gen-model loop and two runs")
	dir := t.TempDir()
	out, _ := runDocLine(t, lines[0], nil, "/tmp/", dir+"/")
	for _, a := range []string{"llama3", "mistral", "qwen3", "phi3", "gemma2", "gemma3", "smollm3", "granite"} {
		assert.Contains(t, out, filepath.Join(dir, a+"-6m.gguf"))
	}
	for _, a := range []string{"phi3", "gemma2", "gemma3", "qwen3"} {
		assert.Contains(t, out, ": "+a+", ", "gen-model names the GGUF architecture")
	}
	for _, l := range lines[1:] {
		out, errOut := runDocLine(t, l, []string{"XPU_CACHE_DIR=" + dir}, "/tmp/", dir+"/")
		assert.True(t, strings.HasPrefix(out, "the cat sat"), "%s: %q", l, out)
		assert.Regexp(t, `decode: \d+ tokens`, errOut, l)
	}
}
