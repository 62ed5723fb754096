package tokenizer

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
)

// vocabTestSep separates the texts of a llama.cpp ggml-vocab-*.gguf.inp file, as its
// tests/test-tokenizer-0 reads them.
const vocabTestSep = "\n__ggml_vocab_test__\n"

// readVocabTests reads llama.cpp's tokenizer test pair for a vocabulary file: the texts of
// path.inp and the ids of path.out, one line per text.
func readVocabTests(path string) ([]string, [][]int32, error) {
	inp, err := os.ReadFile(path + ".inp")
	if err != nil {
		return nil, nil, err
	}
	out, err := os.ReadFile(path + ".out")
	if err != nil {
		return nil, nil, err
	}
	// test-tokenizer-0 cuts at every separator and keeps what follows the last one only when
	// it is not empty (the files end with a separator).
	texts := strings.Split(string(inp), vocabTestSep)
	if texts[len(texts)-1] == "" {
		texts = texts[:len(texts)-1]
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(texts) {
		return nil, nil, &os.PathError{Op: "read", Path: path + ".out",
			Err: strconv.ErrSyntax}
	}
	ids := make([][]int32, len(lines))
	for i, line := range lines {
		ids[i] = []int32{}
		for _, f := range strings.Fields(line) {
			n, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				return nil, nil, err
			}
			ids[i] = append(ids[i], int32(n))
		}
	}
	return texts, ids, nil
}

// TestLlamaCppVocabFiles runs llama.cpp's own tokenizer tests: for every ggml-vocab-*.gguf in
// XPU_LLAMA_VOCAB_DIR that has its .inp/.out pair (the files of llama.cpp's models/ folder;
// none is in this repository), every text encodes (no BOS, control tokens not parsed, as
// tests/test-tokenizer-0 does) to llama.cpp's ids. A vocabulary llama.cpp ships without its
// pair (gpt-neox, baichuan) is checked on the same texts against XPU_LLAMA_TOKENIZE (a
// llama-tokenize) when that is set, the empty text left out (llama-tokenize has no empty
// prompt).
func TestLlamaCppVocabFiles(t *testing.T) {
	dir := os.Getenv("XPU_LLAMA_VOCAB_DIR")
	if dir == "" {
		t.Skip("XPU_LLAMA_VOCAB_DIR (a folder of llama.cpp's models/ggml-vocab-*.gguf with their .inp/.out) is not set")
	}
	bin := os.Getenv("XPU_LLAMA_TOKENIZE")
	files, err := filepath.Glob(filepath.Join(dir, "ggml-vocab-*.gguf"))
	require.NoError(t, err)
	tested := 0
	for _, path := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "ggml-vocab-"), ".gguf")
		t.Run(name, func(t *testing.T) {
			texts, want, err := readVocabTests(path)
			if os.IsNotExist(err) {
				if bin == "" {
					t.Skipf("llama.cpp ships no tests for %s, and XPU_LLAMA_TOKENIZE is not set to ask llama-tokenize", name)
				}
				texts, want = llamaTokenizeTexts(t, bin, path, files)
				err = nil
			}
			require.NoError(t, err)
			f, err := gguf.Open(path)
			require.NoError(t, err)
			defer f.Close()
			tk, err := FromGGUF(f)
			require.NoError(t, err)
			tested++
			ok := 0
			for i, text := range texts {
				got := tk.EncodeWith(text, AddSpecial(false), ParseSpecial(false))
				if assert.Equal(t, want[i], append([]int32{}, got...), "%q", text) {
					ok++
				}
			}
			t.Logf("%s: %d/%d texts as llama.cpp", name, ok, len(texts))
		})
	}
	require.NotZero(t, tested, "no ggml-vocab-*.gguf with tests in %s", dir)
}

// llamaTokenizeTexts is llama-tokenize's ids (no BOS, control tokens not parsed) for the model
// at path of the texts of llama.cpp's test files (the .inp of any of files: they are one text).
func llamaTokenizeTexts(t *testing.T, bin, path string, files []string) ([]string, [][]int32) {
	t.Helper()
	var texts []string
	for _, f := range files {
		if tx, _, err := readVocabTests(f); err == nil {
			texts = tx
			break
		}
	}
	require.NotEmpty(t, texts, "no ggml-vocab-*.gguf.inp next to %s to take the texts from", path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Upstream llama-tokenize turns "\n" in its prompt into a newline unless told not to;
	// forks without the flag do not.
	help, _ := exec.CommandContext(ctx, bin, "--help").CombinedOutput()
	args := []string{"-m", path, "--ids", "--no-bos", "--no-parse-special", "--log-disable"}
	if strings.Contains(string(help), "--no-escape") {
		args = append(args, "--no-escape")
	}
	prompt := filepath.Join(t.TempDir(), "prompt.txt")
	var kept []string
	var ids [][]int32
	for _, text := range texts {
		if text == "" {
			continue
		}
		require.NoError(t, os.WriteFile(prompt, []byte(text), 0o644))
		out, err := exec.CommandContext(ctx, bin, append(args, "-f", prompt)...).Output()
		require.NoError(t, err, "llama-tokenize on %q", text)
		var got []int32
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(string(out))), &got), "%s", out)
		kept = append(kept, text)
		ids = append(ids, got)
	}
	return kept, ids
}
