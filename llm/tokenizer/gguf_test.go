package tokenizer

import (
	"bytes"
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
