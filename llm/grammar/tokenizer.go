package grammar

import (
	"runtime"
	"sync"
	"weak"

	"github.com/xpuhub/xpu/llm/tokenizer"
)

// NewTokenMatcher is NewMatcher over tok's vocabulary: it holds the text tok decodes to a
// sentence of g, a sample.Constraint (llm.WithConstraint). The vocabulary's token strings are
// indexed once per tokenizer and shared.
func NewTokenMatcher(g *Grammar, tok *tokenizer.Tokenizer) *Matcher {
	return NewMatcher(g, vocabOf(tok))
}

var vocabs sync.Map // weak.Pointer[tokenizer.Tokenizer] -> func() *Vocab

// vocabOf is tok's vocabulary as the matcher reads it: each token's bytes as the decoder
// writes them mid-text, and the stop tokens (BOS, which ends generation too, writes no text and
// so is never allowed).
func vocabOf(tok *tokenizer.Tokenizer) *Vocab {
	key := weak.Make(tok)
	build := sync.OnceValue(func() *Vocab {
		pieces := make([]string, tok.Size())
		var stops []int32
		for i := range pieces {
			id := int32(i)
			if tok.IsStop(id) {
				stops = append(stops, id)
				continue
			}
			if id != tok.BOS() {
				pieces[i] = tok.Piece(id)
			}
		}
		return NewVocab(pieces, stops)
	})
	v, loaded := vocabs.LoadOrStore(key, build)
	if !loaded {
		runtime.AddCleanup(tok, func(k weak.Pointer[tokenizer.Tokenizer]) { vocabs.Delete(k) }, key)
	}
	return v.(func() *Vocab)()
}
