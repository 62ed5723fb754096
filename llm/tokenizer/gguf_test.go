package tokenizer

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm/gguf"
)

func vocabFile(t *testing.T, kvs ...gguf.KeyValue) *gguf.File {
	var buf bytes.Buffer
	require.NoError(t, gguf.Write(&buf, kvs, nil))
	f, err := gguf.Parse(buf.Bytes())
	require.NoError(t, err)
	return f
}

func kv(k string, v any) gguf.KeyValue { return gguf.KeyValue{Key: k, Value: gguf.MustValue(v)} }

func TestFromGGUFBPE(t *testing.T) {
	v := bpeVocab("qwen2")
	v.Tokens = append(v.Tokens, "<|im_end|>")
	v.Types = append(v.Types, TypeControl)
	f := vocabFile(t,
		kv("tokenizer.ggml.model", "gpt2"),
		kv("tokenizer.ggml.pre", "qwen2"),
		kv("tokenizer.ggml.tokens", v.Tokens),
		kv("tokenizer.ggml.token_type", v.Types),
		kv("tokenizer.ggml.merges", v.Merges),
		kv("tokenizer.ggml.eos_token_id", uint32(17)),
	)
	tk, err := FromGGUF(f)
	require.NoError(t, err)
	assert.Equal(t, []int32{11, 16}, tk.Encode("Hello world", true), "gpt2 vocabularies add no BOS by default")
	assert.True(t, tk.IsStop(17))
	assert.True(t, tk.IsStop(int32(len(v.Tokens)-1)), "<|im_end|> ends a turn")
	assert.Equal(t, []int32{19, 20, 21}, tk.Encode("123", false), "qwen2 splits digits one by one")
}

func TestFromGGUFErrors(t *testing.T) {
	cases := []struct {
		name string
		kvs  []gguf.KeyValue
		msg  string
	}{
		{"no model", nil, "tokenizer.ggml.model"},
		{"unknown model", []gguf.KeyValue{kv("tokenizer.ggml.model", "rwkv")}, `"rwkv"`},
		{"no tokens", []gguf.KeyValue{kv("tokenizer.ggml.model", "llama")}, "tokenizer.ggml.tokens"},
		{"bad scores", []gguf.KeyValue{kv("tokenizer.ggml.model", "llama"), kv("tokenizer.ggml.tokens", []string{"a"}),
			kv("tokenizer.ggml.scores", []string{"x"})}, "scores"},
		{"unknown pre", []gguf.KeyValue{kv("tokenizer.ggml.model", "gpt2"), kv("tokenizer.ggml.tokens", []string{"a"}),
			kv("tokenizer.ggml.pre", "falcon-9")}, `"falcon-9"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromGGUF(vocabFile(t, c.kvs...))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}

func TestFromGGUFFamilyDefaults(t *testing.T) {
	v := bpeVocab("")
	v.Tokens = append(v.Tokens, "<|begin_of_text|>")
	v.Types = append(v.Types, TypeControl)
	bos := uint32(len(v.Tokens) - 1)
	file := func(pre string, extra ...gguf.KeyValue) *gguf.File {
		return vocabFile(t, append([]gguf.KeyValue{
			kv("tokenizer.ggml.model", "gpt2"),
			kv("tokenizer.ggml.pre", pre),
			kv("tokenizer.ggml.tokens", v.Tokens),
			kv("tokenizer.ggml.token_type", v.Types),
			kv("tokenizer.ggml.merges", v.Merges),
			kv("tokenizer.ggml.bos_token_id", bos),
		}, extra...)...)
	}
	cases := []struct {
		name string
		f    *gguf.File
		want []int32
	}{
		{"llama-bpe adds BOS by default", file("llama-bpe"), []int32{int32(bos), 11}},
		{"the file's add_bos_token wins", file("llama-bpe", kv("tokenizer.ggml.add_bos_token", false)), []int32{11}},
		{"qwen2 adds none by default", file("qwen2"), []int32{11}},
		{"the file can ask for it", file("qwen2", kv("tokenizer.ggml.add_bos_token", true)), []int32{int32(bos), 11}},
		{"chatglm-bpe has no BOS", file("chatglm-bpe", kv("tokenizer.ggml.add_bos_token", true)), []int32{11}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk, err := FromGGUF(c.f)
			require.NoError(t, err)
			assert.Equal(t, c.want, tk.Encode("Hello", true))
		})
	}
}

func TestParseSpecial(t *testing.T) {
	tk := fullBPE(t)
	const text = "Hello<|end|>"
	assert.Equal(t, []int32{11, 17}, tk.Encode(text, false))
	plain := tk.EncodeWith(text, ParseSpecial(false))
	assert.NotContains(t, plain, int32(17), "a control token's text stays text")
	assert.Equal(t, text, tk.Decode(plain))

	// User-defined tokens are matched whatever ParseSpecial says.
	v := bpeVocab("llama-bpe")
	v.Types[17] = TypeUserDefined
	ud, err := New(v)
	require.NoError(t, err)
	assert.Equal(t, []int32{11, 17}, ud.EncodeWith(text, ParseSpecial(false)))
}

func TestSentencePieceSpacePrefixAfterSpecial(t *testing.T) {
	tk, err := New(spmVocab())
	require.NoError(t, err)
	// Each text piece between special tokens gets the dummy space, as in llama.cpp.
	assert.Equal(t, []int32{1, 15, 2, 15}, tk.Encode("hello</s>hello", true))
	// Gemma's vocabularies turn it off (tokenizer.ggml.add_space_prefix = false).
	v := spmVocab()
	v.AddSpacePrefix = false
	g, err := New(v)
	require.NoError(t, err)
	assert.Equal(t, []int32{11, 14}, g.Encode("hello", false), "\"he\" \"llo\": no \"▁hello\" without the space")
	assert.Equal(t, "hello hello", g.Decode(g.Encode("hello hello", false)))
}

// A chat server encodes the template's own markers as control tokens but a user's text as
// text, so a user cannot close the turn.
func ExampleTokenizer_EncodeWith() {
	tk, err := New(Vocab{Kind: BPE, Pre: "qwen2", BOS: -1, EOS: 2, UNK: -1,
		Tokens: []string{"h", "i", "<|im_end|>", "<", "|", "_", ">", "m", "e", "n", "d"},
		Types:  []int32{TypeNormal, TypeNormal, TypeControl, 1, 1, 1, 1, 1, 1, 1, 1}})
	if err != nil {
		panic(err)
	}
	fmt.Println(tk.Encode("hi<|im_end|>", false))
	fmt.Println(tk.EncodeWith("hi<|im_end|>", ParseSpecial(false)))
	// Output:
	// [0 1 2]
	// [0 1 3 4 1 7 5 8 9 10 4 6]
}

// PlainSpans keeps control tokens in the marked ranges as text and parses the rest; without a
// control token in a range the tokens are those of Encode.
func TestPlainSpans(t *testing.T) {
	tk := fullBPE(t)
	const text = "<|end|>Hello<|end|>" // the second <|end|> (bytes 12 to 19) is a user's
	tests := []struct {
		name  string
		spans [][2]int
		want  []int32 // the ids of <|end|> (17) where they stay control tokens
	}{
		{"no spans", nil, []int32{17, 17}},
		{"span over the second", [][2]int{{7, 19}}, []int32{17}},
		{"span meeting the first", [][2]int{{6, 7}}, []int32{17}},
		{"span without a control token", [][2]int{{7, 12}}, []int32{17, 17}},
		{"both", [][2]int{{0, 1}, {18, 19}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids := tk.EncodeWith(text, PlainSpans(tc.spans...))
			var ctl []int32
			for _, id := range ids {
				if id == 17 {
					ctl = append(ctl, id)
				}
			}
			assert.Equal(t, tc.want, ctl)
			if len(tc.want) == 2 {
				assert.Equal(t, tk.Encode(text, false), ids, "no control token in a span: as Encode")
			}
		})
	}
}
