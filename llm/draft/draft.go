// Package draft proposes draft tokens for speculative decoding: continuations retrieved from
// text the model has already seen (the prompt, its own earlier output, earlier answers of the
// same task, and its prefill predictions), which the model then verifies in one pass
// (spec.With). A draft only ever saves time: the verifier keeps the tokens the model
// itself would have produced, so a bad draft costs a wasted verify, never wrong text.
package draft

import (
	"errors"
	"fmt"
)

// ErrInvalidTree: a drafter returned a tree whose parents, tokens or size are out of range.
var ErrInvalidTree = errors.New("draft: invalid draft tree")

// Tree is a draft: node i is token Tokens[i], following node Parents[i], or the last token of
// the sequence (the root) when Parents[i] is -1. A parent comes before its children, and
// siblings come in the drafter's order of preference, so the first-child path is its best
// guess (Primary). A chain is a tree whose node i follows node i-1.
type Tree struct {
	Tokens  []int32
	Parents []int
	// Match is how many of the sequence's last tokens the source of the primary draft agreed
	// with (its suffix or n-gram match), 0 where the drafter does not say. The verifier keeps
	// its acceptance statistics per match length: a long match (the text is being copied) is
	// accepted far more often than a one-token one, and the cheap choice for the latter is
	// not to verify at all.
	Match int
}

// Chain is the tree of one sequence of tokens.
func Chain(tokens []int32) Tree {
	t := Tree{Tokens: append([]int32(nil), tokens...), Parents: make([]int, len(tokens))}
	for i := range t.Parents {
		t.Parents[i] = i - 1
	}
	return t
}

// Prefix is the tree of the first k nodes (all of them when there are fewer): parents come
// before their children, so these are a tree, the drafter's best k nodes.
func (t Tree) Prefix(k int) Tree {
	k = max(0, min(k, len(t.Tokens)))
	return Tree{Tokens: t.Tokens[:k], Parents: t.Parents[:k], Match: t.Match}
}

// Len is the number of draft nodes.
func (t Tree) Len() int { return len(t.Tokens) }

// Validate checks that every parent precedes its child, tokens are in [0, vocab) and the tree
// has at most budget nodes; errors wrap ErrInvalidTree.
func (t Tree) Validate(vocab, budget int) error {
	switch {
	case len(t.Parents) != len(t.Tokens):
		return fmt.Errorf("%w: %d tokens but %d parents", ErrInvalidTree, len(t.Tokens), len(t.Parents))
	case len(t.Tokens) > budget:
		return fmt.Errorf("%w: %d nodes for a budget of %d", ErrInvalidTree, len(t.Tokens), budget)
	}
	for i, p := range t.Parents {
		if p < -1 || p >= i {
			return fmt.Errorf("%w: node %d has parent %d (must be -1 or an earlier node)", ErrInvalidTree, i, p)
		}
		if tok := t.Tokens[i]; tok < 0 || int(tok) >= vocab {
			return fmt.Errorf("%w: node %d is token %d, outside the vocabulary of %d", ErrInvalidTree, i, tok, vocab)
		}
	}
	return nil
}

// Primary is the first-child path from the root: what a verifier that takes one sequence
// verifies. The tree must be valid.
func (t Tree) Primary() []int32 {
	var out []int32
	cur := -1
	for i, p := range t.Parents {
		if p == cur {
			out = append(out, t.Tokens[i])
			cur = i
		}
	}
	return out
}

// Step is what one verify pass found, reported to Drafter.Observe.
type Step struct {
	// Draft is the sequence verified (the draft's path that was run).
	Draft []int32
	// Accepted is how many of Draft's tokens the model agreed with, in order.
	Accepted int
	// Predictions[i] is the model's choice after the root (i = 0) and after Draft[i-1]: one
	// more than Draft. Predictions[Accepted] is the token the step appended after the
	// accepted ones; later ones are conditioned on the rejected draft.
	Predictions []int32
}

// Drafter proposes drafts. A drafter serves one sequence at a time and need not be safe for
// concurrent use.
type Drafter interface {
	// Propose drafts at most budget tokens to follow history (every token of the sequence so
	// far, prompt included; the last one is the tree's root). An empty tree means no draft.
	// history is the caller's buffer, valid during the call only: a drafter copies what it
	// keeps.
	Propose(history []int32, budget int) Tree
	// Observe reports the verify pass of the last proposal.
	Observe(step Step)
}

// Candidate is a token the model predicts at a prompt position, with its probability.
type Candidate struct {
	ID int32
	P  float32
}

// Calibrator is a drafter that learns from the model's predictions at every prompt position
// (the prefill's all-position logits): Calibrate gets the prompt and, per position i, the most
// likely tokens to follow prompt[:i+1], most likely first.
type Calibrator interface {
	Calibrate(prompt []int32, predictions [][]Candidate)
}

// Finisher is a drafter that keeps answers for later requests: Finish gets the generated
// tokens once a generation ends.
type Finisher interface {
	Finish(answer []int32) error
}
