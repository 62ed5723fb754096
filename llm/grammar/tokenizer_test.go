package grammar

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/llmtest"
	"github.com/xpuhub/xpu/llm/sample"
)

// A Matcher holds sampling to its grammar (llm.WithConstraint), with the draw-first shortcut.
var (
	_ sample.Constraint   = (*Matcher)(nil)
	_ sample.TokenChecker = (*Matcher)(nil)
)

// The vocabulary the matcher reads is built once per tokenizer and has no text for the stop
// and BOS tokens.
func TestTokenizerVocab(t *testing.T) {
	m := llmtest.Stories(t)
	tok := m.Tokenizer
	v := vocabOf(tok)
	assert.Same(t, v, vocabOf(tok))
	assert.Equal(t, tok.Size(), v.Size())
	mt := NewTokenMatcher(MustParse(`root ::= "a"`), tok)
	logits := make([]float32, tok.Size())
	require.NoError(t, mt.Mask(logits))
	assert.True(t, math.IsInf(float64(logits[tok.EOS()]), -1), "no end before the grammar's")
	assert.True(t, math.IsInf(float64(logits[tok.BOS()]), -1))
	require.NoError(t, mt.AcceptString("a"))
	clear(logits)
	require.NoError(t, mt.Mask(logits))
	assert.False(t, math.IsInf(float64(logits[tok.EOS()]), -1), "the end once complete")
}
