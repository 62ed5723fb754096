package draft

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

func TestTreeValidate(t *testing.T) {
	for _, tt := range []struct {
		name    string
		tree    Tree
		budget  int
		wantErr bool
	}{
		{"empty", Tree{}, 4, false},
		{"chain", Chain([]int32{1, 2, 3}), 3, false},
		{"branches", Tree{Tokens: []int32{1, 2, 3}, Parents: []int{-1, -1, 0}}, 8, false},
		{"over budget", Chain([]int32{1, 2, 3}), 2, true},
		{"parent after child", Tree{Tokens: []int32{1, 2}, Parents: []int{1, -1}}, 8, true},
		{"own parent", Tree{Tokens: []int32{1}, Parents: []int{0}}, 8, true},
		{"parent below -1", Tree{Tokens: []int32{1}, Parents: []int{-2}}, 8, true},
		{"token past vocab", Chain([]int32{10}), 8, true},
		{"negative token", Chain([]int32{-1}), 8, true},
		{"length mismatch", Tree{Tokens: []int32{1, 2}, Parents: []int{-1}}, 8, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.tree.Validate(10, tt.budget)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrInvalidTree)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

func TestTreePrimary(t *testing.T) {
	tr := Tree{Tokens: []int32{1, 2, 3, 4, 5}, Parents: []int{-1, -1, 0, 0, 2}}
	assert.Equal(t, []int32{1, 3, 5}, tr.Primary())
	assert.Equal(t, []int32{7, 8}, Chain([]int32{7, 8}).Primary())
	assert.Empty(t, Tree{}.Primary())
}

// lookupBrute is Index.Lookup's length by brute force: the longest suffix of q occurring in a
// document followed by another token of it.
func lookupBrute(docs [][]int32, q []int32) int {
	for l := len(q); l > 0; l-- {
		suf := q[len(q)-l:]
		for _, d := range docs {
			for s := 0; s+l < len(d); s++ {
				if slices.Equal(d[s:s+l], suf) {
					return l
				}
			}
		}
	}
	return 0
}

// inDoc says seq occurs in one of docs.
func inDoc(docs [][]int32, seq []int32) bool {
	for _, d := range docs {
		for s := 0; s+len(seq) <= len(d); s++ {
			if slices.Equal(d[s:s+len(seq)], seq) {
				return true
			}
		}
	}
	return false
}

func TestIndexMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		x := NewIndex()
		var docs [][]int32
		for range 1 + rng.IntN(3) {
			d := make([]int32, rng.IntN(40))
			for i := range d {
				d[i] = int32(rng.IntN(4))
			}
			docs = append(docs, d)
			x.AddDoc(d)
		}
		for range 20 {
			q := make([]int32, 1+rng.IntN(8))
			for i := range q {
				q[i] = int32(rng.IntN(4))
			}
			want := lookupBrute(docs, q)
			gl, gc := x.Lookup(q, 5)
			require.Equal(t, want, gl, "trial %d docs %v query %v", trial, docs, q)
			if want > 0 {
				require.NotEmpty(t, gc)
				require.LessOrEqual(t, len(gc), 5)
				require.True(t, inDoc(docs, append(slices.Clone(q[len(q)-gl:]), gc...)),
					"trial %d: %v then %v is not in a document", trial, q[len(q)-gl:], gc)
			}
		}
	}
}

func TestLookup(t *testing.T) {
	l := NewLookup()
	h := []int32{5, 6, 7, 8, 9, 1, 6, 7}
	withMatch := func(tr Tree, m int) Tree { tr.Match = m; return tr }
	// "6 7" matched: two tokens
	assert.Equal(t, withMatch(Chain([]int32{8, 9, 1}), 2), l.Propose(h, 3))
	assert.Equal(t, withMatch(Chain([]int32{8}), 2), l.Propose(h, 1))
	assert.Empty(t, l.Propose([]int32{1, 2, 3}, 4).Tokens, "nothing repeats")
	assert.Empty(t, l.Propose(h, 0).Tokens)
	// the newest occurrence wins
	assert.Equal(t, withMatch(Chain([]int32{3}), 1), l.Propose([]int32{1, 2, 1, 3, 1}, 1))
}

func TestRetrievalContextAndHistory(t *testing.T) {
	dir := t.TempDir()
	h, err := OpenHistory(filepath.Join(dir, "h.hist"), 100, 0)
	require.NoError(t, err)
	require.NoError(t, h.Add([]int32{40, 41, 42, 43, 44}))
	r := NewRetrieval(RetrievalOptions{History: h})
	// from the sequence itself
	tr := r.Propose([]int32{1, 2, 3, 4, 9, 2, 3}, 4)
	require.NoError(t, tr.Validate(100, 4))
	assert.Equal(t, []int32{4, 9, 2, 3}, tr.Primary())
	assert.Equal(t, 2, tr.Match, "the suffix 2 3 matched")
	// from an earlier answer
	tr = r.Propose([]int32{1, 2, 3, 4, 9, 2, 3, 41, 42}, 2)
	assert.Equal(t, []int32{43, 44}, tr.Primary())
	assert.Equal(t, 2, tr.Match, "the suffix 41 42 matched")
	// a new sequence starts over
	tr = r.Propose([]int32{7, 7}, 3)
	assert.Equal(t, []int32{7}, tr.Primary())
	require.NoError(t, r.Finish([]int32{60, 61, 62}))
	h2, err := OpenHistory(filepath.Join(dir, "h.hist"), 100, 0)
	require.NoError(t, err)
	assert.Equal(t, [][]int32{{40, 41, 42, 43, 44}, {60, 61, 62}}, h2.Answers())
}

func TestRetrievalReuse(t *testing.T) {
	r := NewRetrieval(RetrievalOptions{CalibrateTopK: -1})
	hist := []int32{1, 2}
	r.Propose(hist, 4)
	// the draft 10 11 12 13 was rejected at 10 (the model said 20), but the model agreed that
	// 11 follows 10 and 12 follows 11
	r.Observe(Step{Draft: []int32{10, 11, 12, 13}, Accepted: 0, Predictions: []int32{20, 11, 12, 5, 6}})
	tr := r.Propose([]int32{1, 2, 20}, 4)
	assert.Equal(t, []int32{10, 11, 12}, tr.Primary(), "the kept segment follows the inserted token")
	// after it went in partly, the rest is offered
	tr = r.Propose([]int32{1, 2, 20, 10}, 4)
	assert.Equal(t, []int32{11, 12}, tr.Primary())
	// its life ends
	r.Observe(Step{Draft: []int32{11}, Accepted: 1, Predictions: []int32{11, 3}})
	r.Observe(Step{Draft: []int32{3}, Accepted: 1, Predictions: []int32{3, 4}})
	assert.Empty(t, r.Propose([]int32{1, 2, 20, 10, 11, 3, 4, 99}, 4).Tokens)
}

func TestRetrievalCalibrate(t *testing.T) {
	// prompt: "a b c d e f"; the model would say x after b, and after x what it says after
	// c's occurrence... x does not occur, so the sequence is "a b x"
	prompt := []int32{1, 2, 3, 4, 5, 6}
	preds := make([][]Candidate, len(prompt))
	for i := range preds {
		if i+1 < len(prompt) {
			preds[i] = []Candidate{{ID: prompt[i+1], P: 0.9}}
		}
	}
	preds[1] = []Candidate{{ID: 50, P: 0.6}, {ID: 3, P: 0.3}} // after 2: 50 (not 3)
	preds[5] = []Candidate{{ID: 4, P: 0.8}}                   // after the prompt: 4, then as at 4
	r := NewRetrieval(RetrievalOptions{})
	r.Calibrate(prompt, preds)
	tr := r.Propose(append(slices.Clone(prompt), 1, 2), 3)
	assert.Equal(t, []int32{50}, tr.Primary(), "the model's wording beats the prompt's on a tie")
	tr = r.Propose(append(slices.Clone(prompt), 7, 6), 3)
	assert.Equal(t, []int32{4, 5, 6}, tr.Primary(), "the answer's start follows the predictions along the prompt")
}

func TestHistoryStore(t *testing.T) {
	dir := t.TempDir()
	path := HistoryPath(dir, "summaries/../x", "model")
	assert.Equal(t, dir, filepath.Dir(path), "the task name cannot leave the dir")
	h, err := OpenHistory(path, 50, 6)
	require.NoError(t, err)
	require.NoError(t, h.Add([]int32{1, 2, 3}))
	require.NoError(t, h.Add([]int32{4, 5}))
	require.NoError(t, h.Add([]int32{6, 7}))
	assert.Equal(t, [][]int32{{4, 5}, {6, 7}}, h.Answers(), "the oldest goes past the budget")
	require.ErrorIs(t, h.Add([]int32{50}), core.ErrInvalidArgument)
	require.NoError(t, h.Add(make([]int32, 10)))
	assert.Equal(t, [][]int32{make([]int32, 6)}, h.Answers(), "an answer over the budget keeps its end")

	for name, data := range map[string][]byte{
		"garbage":     []byte("not a history file"),
		"bad crc":     append(EncodeHistory([][]int32{{1, 2}}, 50)[:16+8], 0, 0, 0, 0),
		"truncated":   EncodeHistory([][]int32{{1, 2}}, 50)[:18],
		"other vocab": EncodeHistory([][]int32{{1, 2}}, 51),
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name+".hist")
			require.NoError(t, os.WriteFile(p, data, 0o644))
			h, err := OpenHistory(p, 50, 0)
			require.ErrorIs(t, err, ErrCorrupt)
			require.NotNil(t, h, "a corrupt store is an empty, usable one")
			assert.Empty(t, h.Answers())
			require.NoError(t, h.Add([]int32{3}))
			h, err = OpenHistory(p, 50, 0)
			require.NoError(t, err, "the next Add replaced the file")
			assert.Equal(t, [][]int32{{3}}, h.Answers())
		})
	}
}

func FuzzParseHistory(f *testing.F) {
	f.Add(EncodeHistory([][]int32{{1, 2, 3}, {4}}, 16))
	f.Add(EncodeHistory(nil, 16))
	f.Add([]byte("XPUHIST1\x10\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		answers, err := ParseHistory(data, 16)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		for _, a := range answers {
			for _, tok := range a {
				require.True(t, tok >= 0 && tok < 16)
			}
		}
		again, err := ParseHistory(EncodeHistory(answers, 16), 16)
		require.NoError(t, err)
		require.Equal(t, len(answers), len(again))
	})
}

// BenchmarkIndex builds an index as in-context calibration and the context index do (tokens
// of a 512-token vocabulary with repeated phrases, 4096 of them) and looks up 32-token
// suffixes in it, as every draft does:
//
//	go test ./llm/draft -run X -bench Index
func BenchmarkIndex(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	phrases := make([][]int32, 64)
	for i := range phrases {
		phrases[i] = make([]int32, 3+rng.IntN(10))
		for j := range phrases[i] {
			phrases[i][j] = int32(rng.IntN(512))
		}
	}
	var text []int32
	for len(text) < 4096 {
		text = append(text, phrases[rng.IntN(len(phrases))]...)
	}
	b.Run("build", func(b *testing.B) {
		for b.Loop() {
			x := NewIndex()
			x.AddDoc(text)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(text)), "ns/token")
	})
	b.Run("lookup", func(b *testing.B) {
		x := NewIndex()
		x.AddDoc(text)
		n := 0
		for b.Loop() {
			at := 32 + n%(len(text)-32)
			x.Lookup(text[at-32:at], 8)
			n++
		}
	})
}
