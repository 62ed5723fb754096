package tokenizer

import (
	"container/heap"
	"strconv"
	"strings"
	"unicode/utf8"
)

// spmSpace is SentencePiece's visible space, U+2581.
const spmSpace = "\u2581"

func isByteToken(s string) bool {
	return len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>'
}

func parseByteToken(s string) (byte, bool) {
	if !isByteToken(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[3:5], 16, 8)
	return byte(v), err == nil
}

// spmSymbol is one piece of the text in a doubly linked list; a piece merged into its left
// neighbour has empty text.
type spmSymbol struct {
	text       string
	prev, next int
}

type spmBigram struct {
	left, right int
	score       float32
	size        int // length of the merged text, to detect stale entries
}

type bigramHeap []spmBigram

func (h bigramHeap) Len() int { return len(h) }
func (h bigramHeap) Less(i, j int) bool {
	if h[i].score != h[j].score {
		return h[i].score > h[j].score
	}
	return h[i].left < h[j].left
}
func (h bigramHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *bigramHeap) Push(x any)   { *h = append(*h, x.(spmBigram)) }
func (h *bigramHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encodeSPM is llama.cpp's SentencePiece-BPE: start from characters, repeatedly merge the
// adjacent pair whose concatenation is a token with the highest score (leftmost on ties), then
// spell pieces that are not tokens as byte tokens.
func (t *Tokenizer) encodeSPM(out []int32, text string) []int32 {
	if text == "" {
		return out
	}
	if t.v.AddSpacePrefix {
		text = " " + text
	}
	text = strings.ReplaceAll(text, " ", spmSpace)
	syms := make([]spmSymbol, 0, len(text))
	for i := 0; i < len(text); {
		_, n := utf8.DecodeRuneInString(text[i:])
		syms = append(syms, spmSymbol{text: text[i : i+n], prev: len(syms) - 1, next: len(syms) + 1})
		i += n
	}
	syms[len(syms)-1].next = -1
	h := &bigramHeap{}
	try := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		s := syms[l].text + syms[r].text
		id, ok := t.index[s]
		if !ok {
			return
		}
		var score float32
		if t.v.Scores != nil {
			score = t.v.Scores[id]
		}
		heap.Push(h, spmBigram{left: l, right: r, score: score, size: len(s)})
	}
	for i := 1; i < len(syms); i++ {
		try(i-1, i)
	}
	for h.Len() > 0 {
		b := heap.Pop(h).(spmBigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.text == "" || r.text == "" || len(l.text)+len(r.text) != b.size || l.next != b.right {
			continue // one side was merged since this entry was pushed
		}
		l.text += r.text
		r.text = ""
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		try(l.prev, b.left)
		try(b.left, l.next)
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		s := syms[i].text
		if id, ok := t.index[s]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(s); j++ {
			switch {
			case t.bytes[s[j]] >= 0:
				out = append(out, t.bytes[s[j]])
			case t.v.UNK >= 0:
				out = append(out, t.v.UNK)
			}
		}
	}
	return out
}
