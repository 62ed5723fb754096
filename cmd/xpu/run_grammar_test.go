package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --grammar, --grammar-file and --json-schema hold run's output to the grammar.
func TestRunGrammar(t *testing.T) {
	model := storiesPath(t)
	dir := t.TempDir()
	gfile := filepath.Join(dir, "answer.gbnf")
	require.NoError(t, os.WriteFile(gfile, []byte("# yes or no, then a number\nroot ::= (\"yes\" | \"no\") \", \" [0-9]{1,3} \".\"\n"), 0o644))
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"legs":{"type":"integer"},
		"kind":{"enum":["cat","dog"]},"toys":{"type":"array","items":{"type":"number"},"maxItems":2}},
		"required":["name","legs","kind","toys"],"additionalProperties":false}`
	sfile := filepath.Join(dir, "pet.json")
	require.NoError(t, os.WriteFile(sfile, []byte(schema), 0o644))
	const prompt = "Once upon a time"
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, text string)
	}{
		{"grammar", []string{"--grammar", `root ::= "The " [a-z]+ " was " ("big" | "small") "."`}, func(t *testing.T, text string) {
			assert.Regexp(t, regexp.MustCompile(`^The [a-z]+ was (big|small)\.$`), text)
		}},
		{"grammar file", []string{"--grammar-file", gfile}, func(t *testing.T, text string) {
			assert.Regexp(t, regexp.MustCompile(`^(yes|no), [0-9]{1,3}\.$`), text)
		}},
		{"json schema", []string{"--json-schema", schema}, func(t *testing.T, text string) {
			var v struct {
				Name string
				Legs int
				Kind string
				Toys []float64
			}
			require.NoError(t, json.Unmarshal([]byte(text), &v), text)
			assert.LessOrEqual(t, len([]rune(v.Name)), 8)
			assert.Contains(t, []string{"cat", "dog"}, v.Kind)
			assert.LessOrEqual(t, len(v.Toys), 2)
		}},
		{"json schema file", []string{"--json-schema", "@" + sfile, "--temp", "0.8", "-s", "3"}, func(t *testing.T, text string) {
			assert.True(t, json.Valid([]byte(text)), text)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"run", model, "-p", prompt, "-n", "200", "--temp", "0", "-c", "256"}, tt.args...)
			code, out, errOut := runCLI(t, args...)
			require.Equal(t, 0, code, errOut)
			require.True(t, strings.HasPrefix(out, prompt), out)
			assert.Contains(t, errOut, "stop: eos", "the grammar completed before the token budget")
			tt.check(t, strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n"))
		})
	}
}

// A bad grammar or schema is a usage error that says what is wrong, before the model loads.
func TestRunGrammarErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		args []string
		says string
	}{
		{[]string{"--grammar", `root ::= root "a"`}, "left recursion"},
		{[]string{"--grammar", `root ::= "a`}, "--grammar: grammar: syntax error: line 1: unterminated string"},
		{[]string{"--grammar-file", filepath.Join(dir, "none.gbnf")}, "--grammar-file"},
		{[]string{"--grammar-file", dir}, "not a regular file"},
		{[]string{"--json-schema", `{"type":"string","pattern":"x"}`}, `--json-schema: grammar: json schema: at #: keyword "pattern" is not supported`},
		{[]string{"--json-schema", "@" + filepath.Join(dir, "none.json")}, "--json-schema"},
		{[]string{"--grammar", `root ::= "a"`, "--json-schema", `{}`}, "give one"},
		{[]string{"--grammar", `root ::= "a"`, "--spec", "lookup"}, "cannot be combined with a grammar"},
	}
	for _, tt := range tests {
		code, _, errOut := runCLI(t, append([]string{"run", "missing.gguf"}, tt.args...)...)
		assert.Equal(t, 2, code, "%v: %s", tt.args, errOut)
		assert.Contains(t, errOut, tt.says, "%v", tt.args)
	}
}
