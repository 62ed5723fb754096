package draft

import "slices"

// Lookup is prompt-lookup decoding, the simple baseline: the last n tokens (n from Max down to
// Min) are searched for in the sequence so far, most recent occurrence first, and the tokens
// that followed it are the draft. It keeps no state between calls.
type Lookup struct {
	Min, Max int
}

// NewLookup returns a prompt-lookup drafter matching n-grams of 1 to 3 tokens (llama.cpp's
// lookup defaults to n-grams of the same order).
func NewLookup() *Lookup { return &Lookup{Min: 1, Max: 3} }

// Propose implements Drafter.
func (l *Lookup) Propose(history []int32, budget int) Tree {
	if budget <= 0 {
		return Tree{}
	}
	for n := min(l.Max, len(history)-1); n >= max(l.Min, 1); n-- {
		tail := history[len(history)-n:]
		// the newest earlier occurrence: one that starts before the tail itself
		for s := len(history) - n - 1; s >= 0; s-- {
			if !slices.Equal(history[s:s+n], tail) {
				continue
			}
			end := min(s+n+budget, len(history))
			t := Chain(history[s+n : end])
			t.Match = n
			return t
		}
	}
	return Tree{}
}

// Observe implements Drafter (Lookup learns nothing).
func (*Lookup) Observe(Step) {}
