package tokenizer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
)

// wpmTokens is a small BERT vocabulary in the converter's phantom-space form: word-initial
// pieces start with "▁", continuations ("##lo" in BERT) are bare. Every ASCII letter and digit
// is both, so any ASCII word is covered; punctuation is word-initial only (it is always a word
// of its own).
func wpmTokens() []string {
	toks := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
		"▁hello", "▁world", "▁un", "aff", "able", "▁affable", "lo", "▁he", "▁中", "▁the", "ing", "▁play",
		"▁it", "▁'", "▁,", "▁.", "▁!", "▁$", "▁+", "▁^", "▁<", "▁>", "▁=", "▁|", "▁~", "▁`", "▁-"}
	for c := 'a'; c <= 'z'; c++ {
		toks = append(toks, "▁"+string(c), string(c))
	}
	for c := '0'; c <= '9'; c++ {
		toks = append(toks, "▁"+string(c), string(c))
	}
	return toks
}

// wpmKVs are the GGUF keys of wpmTokens as llama.cpp's converter writes a BERT vocabulary.
func wpmKVs() []gguf.KeyValue {
	toks := wpmTokens()
	types := make([]int32, len(toks))
	for i := range types {
		types[i] = TypeNormal
	}
	for i := 0; i < 5; i++ {
		types[i] = TypeControl
	}
	return []gguf.KeyValue{
		kv("tokenizer.ggml.model", "bert"),
		kv("tokenizer.ggml.tokens", toks),
		kv("tokenizer.ggml.token_type", types),
		kv("tokenizer.ggml.bos_token_id", uint32(2)),
		kv("tokenizer.ggml.unknown_token_id", uint32(1)),
		kv("tokenizer.ggml.seperator_token_id", uint32(3)),
		kv("tokenizer.ggml.padding_token_id", uint32(0)),
	}
}

func TestWordPiece(t *testing.T) {
	tk, err := FromGGUF(vocabFile(t, wpmKVs()...))
	require.NoError(t, err)
	id := func(s string) int32 {
		i, ok := tk.index[s]
		require.True(t, ok, s)
		return i
	}
	cases := []struct {
		name    string
		text    string
		special bool
		want    []int32
	}{
		{"whole words", "hello world", false, []int32{id("▁hello"), id("▁world")}},
		{"cls and sep frame the text", "hello", true, []int32{id("[CLS]"), id("▁hello"), id("[SEP]")}},
		{"longest piece first", "unaffable", false, []int32{id("▁un"), id("aff"), id("able")}},
		{"a word-initial piece wins over its prefix", "affable", false, []int32{id("▁affable")}},
		{"continuations", "helloing", false, []int32{id("▁hello"), id("ing")}},
		{"lowercased", "HeLLo WORLD", false, []int32{id("▁hello"), id("▁world")}},
		{"accents dropped by the decomposition", "héllo", false, []int32{id("▁hello")}},
		{"punctuation is a word", "hello,world!", false, []int32{id("▁hello"), id("▁,"), id("▁world"), id("▁!")}},
		{"apostrophe splits", "it's", false, []int32{id("▁it"), id("▁'"), id("▁s")}},
		{"ascii symbols are words", "1+1=2", false, []int32{id("▁1"), id("▁+"), id("▁1"), id("▁="), id("▁2")}},
		{"CJK ideographs are words", "中中", false, []int32{id("▁中"), id("▁中")}},
		{"an uncovered word is one unknown", "hello ωmega world", false, []int32{id("▁hello"), id("[UNK]"), id("▁world")}},
		{"control characters dropped", "hel\x00lo\u200b", false, []int32{id("▁hello")}},
		{"whitespace of every kind", "\thello\u3000\nworld  ", false, []int32{id("▁hello"), id("▁world")}},
		{"empty", "", true, []int32{id("[CLS]"), id("[SEP]")}},
		{"control token text", "hello[SEP]world", false, []int32{id("▁hello"), id("[SEP]"), id("▁world")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, tk.Encode(c.text, c.special))
		})
	}
	// Without parsing control tokens "[SEP]" is text: "[" and "]" are words of their own, which
	// this vocabulary lacks.
	assert.Equal(t, []int32{id("▁hello"), id("[UNK]"), id("▁s"), id("e"), id("p"), id("[UNK]")},
		tk.EncodeWith("hello[SEP]", ParseSpecial(false)))
	// Decoding joins the pieces with their phantom spaces (no clean-up of the space before
	// punctuation: embedding models do not generate text), the first word's dropped.
	assert.Equal(t, "hello world !", tk.Decode(tk.Encode("hello world!", true)),
		"[CLS] and [SEP] decode to nothing")
}

// A SentencePiece or BPE file's separator key is not read: files write 0xFFFFFFFF there for
// none, which would be an id outside the vocabulary.
func TestSeparatorKeyOnlyForWordPiece(t *testing.T) {
	v := spmVocab()
	_, err := FromGGUF(vocabFile(t, kv("tokenizer.ggml.model", "llama"), kv("tokenizer.ggml.tokens", v.Tokens),
		kv("tokenizer.ggml.seperator_token_id", uint32(0xFFFFFFFF))))
	require.NoError(t, err)
}

func TestWordPieceVocabErrors(t *testing.T) {
	kvs := wpmKVs()
	kvs[len(kvs)-2] = kv("tokenizer.ggml.seperator_token_id", uint32(5000))
	_, err := FromGGUF(vocabFile(t, kvs...))
	assert.ErrorContains(t, err, "seperator_token_id")
	// A vocabulary smaller than BERT's default ids has no [CLS]/[SEP] unless the keys name them.
	small, err := FromGGUF(vocabFile(t, kv("tokenizer.ggml.model", "bert"), kv("tokenizer.ggml.tokens", []string{"▁a", "a"})))
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 1}, small.Encode("aa", true))
	assert.Equal(t, []int32{}, append([]int32{}, small.Encode("b", true)...), "no [UNK] to give")
}

func TestWPMSplit(t *testing.T) {
	cases := []struct {
		text string
		want []string
	}{
		{"Hello, World!", []string{"hello", ",", "world", "!"}},
		{"naïve café", []string{"naive", "cafe"}},
		{"한국", []string{"\u1112\u1100"}},   // Hangul syllables: their leading consonants
		{"x\u0301y", []string{"x\u0301y"}}, // a combining mark already decomposed stays
		{"a$b`c", []string{"a", "$", "b", "`", "c"}},
		{"a€b", []string{"a€b"}}, // a symbol outside ASCII joins the word
		{"日本語", []string{"日", "本", "語"}},
		{"", nil},
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) {
			assert.Equal(t, c.want, wpmSplit(c.text))
		})
	}
}
