package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/PERFORMANCE.md is exactly what the stored results give: nobody edits it by hand.
func TestPerformanceMDIsGenerated(t *testing.T) {
	rs, err := Load(filepath.Join("..", "results"))
	require.NoError(t, err)
	require.NotEmpty(t, rs)
	var b bytes.Buffer
	require.NoError(t, Render(&b, rs))
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "PERFORMANCE.md"))
	require.NoError(t, err)
	assert.Equal(t, b.String(), string(got), "docs/PERFORMANCE.md differs from lab/results: run go run ./lab/perfgen")
	assert.LessOrEqual(t, strings.Count(string(got), "\n"), 200, "one current table per area, not a diary")
	for _, r := range rs {
		assert.NotEmpty(t, r.Machine, r.Name)
		assert.NotEmpty(t, r.Commit, r.Name)
	}
}

func testResult(name, machine, value string) Result {
	return Result{Area: "llm", Name: name, Value: value, Unit: "tok/s", Machine: machine, Commit: "abc1234",
		Date: "2026-01-02", Command: "bench/vs-llamacpp.sh m.gguf"}
}

// A rerun of the same figure on the same machine replaces its row; another machine's figure
// gets a row of its own.
func TestRecordReplacesTheRow(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Record(dir, testResult("tg128", "cpu A", "10")))
	require.NoError(t, Record(dir, testResult("pp512", "cpu A", "100")))
	require.NoError(t, Record(dir, testResult("tg128", "cpu A", "12")))
	require.NoError(t, Record(dir, testResult("tg128", "cpu B", "7")))
	rs, err := Load(dir)
	require.NoError(t, err)
	require.Len(t, rs, 3)
	assert.Equal(t, "12", rs[0].Value, "replaced in place")
	assert.Equal(t, "pp512", rs[1].Name)
	assert.Equal(t, "cpu B", rs[2].Machine)

	var b bytes.Buffer
	require.NoError(t, Render(&b, rs))
	page := b.String()
	assert.Equal(t, 1, strings.Count(page, "| tg128 | 12 tok/s |"))
	assert.NotContains(t, page, "| 10 tok/s |")
	assert.Contains(t, page, "| M1 | cpu A |")
	assert.Contains(t, page, "| M2 | cpu B |")
	assert.Contains(t, page, "## Model prefill and decode")
}

func TestRecordRefusesBadResults(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Result)
		want string
	}{
		{"no machine", func(r *Result) { r.Machine = " " }, "required"},
		{"no commit", func(r *Result) { r.Commit = "" }, "required"},
		{"no command", func(r *Result) { r.Command = "" }, "required"},
		{"bad date", func(r *Result) { r.Date = "28.11.2026" }, "YYYY-MM-DD"},
		{"bad area", func(r *Result) { r.Area = "../x" }, "area"},
		{"line break", func(r *Result) { r.Note = "a\nb" }, "line break"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testResult("tg128", "cpu", "1")
			tt.edit(&r)
			err := Record(t.TempDir(), r)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestLoadRefusesBrokenFiles(t *testing.T) {
	for name, line := range map[string]string{
		"not json":      "{",
		"unknown field": `{"area":"llm","name":"x","value":"1","machine":"m","commit":"c","date":"2026-01-02","command":"c","speed":1}`,
		"missing field": `{"area":"llm","name":"x","value":"1","commit":"c","date":"2026-01-02","command":"c"}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "llm.jsonl"), []byte(line+"\n"), 0o644))
			_, err := Load(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "llm.jsonl:1")
		})
	}
}

// The pipe in a command does not split the table's cells.
func TestRenderEscapesPipes(t *testing.T) {
	r := testResult("tg", "m", "1")
	r.Command = "a | b"
	var b bytes.Buffer
	require.NoError(t, Render(&b, []Result{r}))
	assert.Contains(t, b.String(), "`a \\| b`")
}

func TestCheckMode(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, Record(dir, testResult("tg", "m", "1")))
	page := filepath.Join(dir, "PERFORMANCE.md")
	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-results", dir, "-o", page}, &out, &errb), errb.String())
	require.Equal(t, 0, run([]string{"-results", dir, "-o", page, "-check"}, &out, &errb), errb.String())
	require.Equal(t, 0, run([]string{"record", "-results", dir, "-area", "llm", "-name", "tg", "-value", "2", "-machine", "m",
		"-commit", "c", "-date", "2026-01-03", "-command", "x"}, &out, &errb), errb.String())
	assert.Equal(t, 1, run([]string{"-results", dir, "-o", page, "-check"}, &out, &errb), "the page is stale after a record")
	assert.Contains(t, errb.String(), "run go run ./lab/perfgen")
}
