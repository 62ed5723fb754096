package main

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sched/soc/README.md's "Predicted against published" table quotes what `xpu plan --soc ...
// --papers` prints: each row's PREDICTED figure (to the README's precision) and ratio, in the
// order the two commands print them.
func TestSoCReadmeTableMatchesPlan(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "sched", "soc", "README.md"))
	require.NoError(t, err)
	text := string(b)
	i := strings.Index(text, "## Predicted against published")
	require.GreaterOrEqual(t, i, 0)
	num := regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)
	type fig struct {
		predicted string
		ratio     float64
	}
	var quoted []fig
	for _, row := range strings.Split(text[i:], "\n") {
		cells := strings.Split(row, "|")
		if len(cells) != 7 || strings.TrimSpace(cells[1]) == "figure" || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(cells[5]), 64)
		require.NoError(t, err, row)
		quoted = append(quoted, fig{num.FindString(cells[4]), r})
	}
	require.Len(t, quoted, 7, "the table's rows")

	var printed []fig
	line := regexp.MustCompile(`\s([0-9.]+)(?: tok/s|%)\s+([0-9]+\.[0-9]{2})\s`)
	for _, args := range [][]string{
		{"plan", "--soc", "sd8gen3", "--model", "qwen1.5-1.8b", "--papers"},
		{"plan", "--soc", "sd8gen3", "--model", "llama-8b", "--units", "gpu,npu", "--papers"},
	} {
		code, out, errOut := runCLI(t, args...)
		require.Equal(t, 0, code, errOut)
		j := strings.Index(out, "against the papers")
		require.GreaterOrEqual(t, j, 0, out)
		for _, m := range line.FindAllStringSubmatch(out[j:], -1) {
			r, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err)
			printed = append(printed, fig{m[1], r})
		}
	}
	require.Len(t, printed, len(quoted), "rows printed by the two commands")
	for k, q := range quoted {
		assert.InDelta(t, q.ratio, printed[k].ratio, 1e-9, "row %d's ratio", k+1)
		want, err := strconv.ParseFloat(q.predicted, 64)
		require.NoError(t, err)
		got, err := strconv.ParseFloat(printed[k].predicted, 64)
		require.NoError(t, err)
		decimals := 0
		if d := strings.Index(q.predicted, "."); d >= 0 {
			decimals = len(q.predicted) - d - 1
		}
		assert.InDelta(t, want, got, 0.5*math.Pow(10, -float64(decimals))+1e-9, "row %d's PREDICTED figure", k+1)
	}
}
