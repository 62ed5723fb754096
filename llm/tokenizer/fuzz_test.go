package tokenizer

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// fullSPM has every byte token, so any UTF-8 text must survive encode and decode.
func fullSPM(t testing.TB) *Tokenizer {
	v := spmVocab()
	for b := 0; b < 256; b++ {
		s := fmt.Sprintf("<0x%02X>", b)
		if b == 0x21 || b == 0xC3 || b == 0xA9 {
			continue
		}
		v.Tokens = append(v.Tokens, s)
		v.Scores = append(v.Scores, 0)
		v.Types = append(v.Types, TypeByte)
	}
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// fullBPE has every byte-level character, so any text must survive encode and decode.
func fullBPE(t testing.TB) *Tokenizer {
	v := bpeVocab("llama-bpe")
	have := map[string]bool{}
	for _, s := range v.Tokens {
		have[s] = true
	}
	for b := 0; b < 256; b++ {
		if s := string(byteToRune[b]); !have[s] {
			v.Tokens = append(v.Tokens, s)
			v.Types = append(v.Types, TypeNormal)
		}
	}
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"hello", "hello world", " x ", "é!\n\n  1234 it's", "\xff\xfe", "<|end|>"} {
		f.Add(s)
	}
	spm, bpe := fullSPM(f), fullBPE(f)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // SentencePiece works on characters; invalid UTF-8 is not text
		}
		if got := spm.Decode(spm.Encode(s, true)); got != s {
			t.Fatalf("sentencepiece: %q -> %q", s, got)
		}
		if strings.Contains(s, "<|end|>") {
			return // a control token in the text decodes to nothing, by design
		}
		if got := bpe.Decode(bpe.Encode(s, false)); got != s {
			t.Fatalf("bpe: %q -> %q", s, got)
		}
	})
}
