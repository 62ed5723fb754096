package tokenizer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func spmVocab() Vocab {
	toks := []string{"<unk>", "<s>", "</s>", "<0x21>", "<0xC3>", "<0xA9>", "▁", "h", "e", "l", "o",
		"he", "ll", "▁he", "llo", "▁hello"}
	scores := []float32{0, 0, 0, 0, 0, 0, -10, -10, -10, -10, -10, -1, -2, -3, -4, -5}
	types := []int32{2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
	return Vocab{Kind: SentencePiece, Tokens: toks, Scores: scores, Types: types, BOS: 1, EOS: 2,
		UNK: 0, AddBOS: true, AddSpacePrefix: true}
}

func TestSentencePiece(t *testing.T) {
	tk, err := New(spmVocab())
	require.NoError(t, err)
	cases := []struct {
		text    string
		special bool
		want    []int32
	}{
		{"hello", false, []int32{15}},
		{"hello!é", true, []int32{1, 15, 3, 4, 5}},
		{"hello hello", false, []int32{15, 15}},
		{"he", false, []int32{13}},
		{"", true, []int32{1}},
		{"x", false, []int32{6, 0}}, // neither a token nor a byte token: unknown
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) {
			assert.Equal(t, c.want, tk.Encode(c.text, c.special))
		})
	}
	assert.Equal(t, "hello!é", tk.Decode([]int32{1, 15, 3, 4, 5}))
	assert.Equal(t, "hello hello", tk.Decode(tk.Encode("hello hello", true)))
	assert.True(t, tk.IsStop(2))
	assert.False(t, tk.IsStop(1))
}

func TestStreamingDecoderHoldsPartialUTF8(t *testing.T) {
	tk, err := New(spmVocab())
	require.NoError(t, err)
	d := tk.NewDecoder()
	assert.Equal(t, "hello", d.Next(15))
	assert.Equal(t, "", d.Next(4)) // first byte of é
	assert.Equal(t, "é", d.Next(5))
	assert.Equal(t, "", d.Next(4))
	assert.Equal(t, "\xc3", d.Flush())
}

func bpeVocab(pre string) Vocab {
	toks := []string{"H", "e", "l", "o", "Ġ", "w", "r", "d", "He", "ll", "llo", "Hello", "Ġw", "or",
		"Ġwor", "ld", "Ġworld", "<|end|>", "!", "1", "2", "3", "123"}
	types := make([]int32, len(toks))
	for i := range types {
		types[i] = TypeNormal
	}
	types[17] = TypeControl
	return Vocab{Kind: BPE, Tokens: toks, Types: types, Pre: pre, BOS: -1, EOS: 17, UNK: -1,
		Merges: []string{"H e", "l l", "ll o", "He llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2"}}
}

func TestBPE(t *testing.T) {
	tk, err := New(bpeVocab("llama-bpe"))
	require.NoError(t, err)
	ids := tk.Encode("Hello world<|end|>!", true)
	assert.Equal(t, []int32{11, 16, 17, 18}, ids)
	assert.Equal(t, "Hello world!", tk.Decode(ids)) // control tokens decode to nothing
	// Llama 3 ignores the merges of a pre-token that is itself a token...
	assert.Equal(t, []int32{22}, tk.Encode("123", false))
	// ...DBRX (same pattern) does not: "123" has no "12" token, so the merge result is spelled
	// by its bytes.
	dbrx, err := New(bpeVocab("dbrx"))
	require.NoError(t, err)
	assert.Equal(t, []int32{19, 20, 21}, dbrx.Encode("123", false))
	assert.True(t, tk.IsStop(17))
}

func TestByteMapIsBijective(t *testing.T) {
	assert.Len(t, runeToByte, 256)
	assert.Equal(t, 'Ġ', byteToRune[' '])
	assert.Equal(t, 'A', byteToRune['A'])
}

func TestNewRejectsBadVocab(t *testing.T) {
	v := spmVocab()
	v.Scores = v.Scores[:3]
	_, err := New(v)
	assert.Error(t, err)
	v = spmVocab()
	v.EOS = 99
	_, err = New(v)
	assert.Error(t, err)
	v = bpeVocab("llama-bpe")
	v.Merges = []string{"nospace"}
	_, err = New(v)
	assert.Error(t, err)
	_, err = New(Vocab{})
	assert.Error(t, err)
}
