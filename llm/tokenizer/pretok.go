package tokenizer

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"

	"github.com/xpuhub/xpu/core"
)

// Published pre-tokenizer patterns, as the models' tokenizer.json files write them. They run as
// written on regexp2 (a backtracking engine with lookaround): Go's regexp has no (?!\S).
const (
	// GPT-2's pattern: case-sensitive contractions, an optional space before letters, digits or
	// punctuation, and whitespace that leaves its last space to the next word.
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	// Llama 3 (cl100k): case-insensitive contractions, up to three digits per piece, line breaks
	// kept with the whitespace before them.
	patLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Qwen2 and StableLM 2: the Llama 3 pattern with single digits.
	patQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Tekken (Mistral Nemo): words split at case changes, single digits.
	patTekken = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// GPT-4o (o200k): tekken's case split plus contractions glued to the word.
	patGPT4o = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// BLOOM, Poro, GPT-3 Finnish: everything up to a space or a sentence mark.
	patBloom = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
	// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee... listed by
	// range in its tokenizer.json. Non-ASCII characters are escaped in these patterns because some
	// (U+1F7D, U+2126, U+212A) are not in normal form and an editor may silently normalize them.
	patDeepSeekLetters = "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
	// SuperBPE: zero-width cuts that group a digit run in threes from the right.
	patThousands  = `(?=(\d{3})+(?!\d))`
	patDeepSeekV3 = `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// preFamily is one BPE pre-tokenizer: the regexes applied in turn (each splits every piece the
// previous ones left into its matches and the text between them), as llama.cpp runs the
// tokenizer.json pre-tokenizer sequences of these models.
type preFamily struct {
	names   []string // tokenizer.ggml.pre values, canonical first
	regexes []string
	// ignoreMerges: a pre-token that is itself in the vocabulary is emitted whole, without
	// running the merges (tokenizer.json "ignore_merges": Llama 3, Tekken).
	ignoreMerges bool
	// addBOS is the family's default for tokenizer.ggml.add_bos_token.
	addBOS bool
	// noBOS: the family has no BOS even where the file names one (ChatGLM 4).
	noBOS bool
}

// preFamilies is the table of BPE pre-tokenizers, keyed by the tokenizer.ggml.pre values that
// llama.cpp's converter writes.
var preFamilies = []preFamily{
	{names: []string{"llama-bpe", "llama3", "llama-v3", "falcon3"}, regexes: []string{patLlama3},
		ignoreMerges: true, addBOS: true},
	{names: []string{"dbrx", "smaug-bpe"}, regexes: []string{patLlama3}},
	{names: []string{"chatglm-bpe"}, regexes: []string{patLlama3}, noBOS: true},
	{names: []string{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, regexes: []string{patQwen2}},
	{names: []string{"gpt-2", "gpt2", "gpt-neox", "mpt", "olmo", "jais", "phi-2", "roberta-bpe", "gigachat",
		"jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"},
		regexes: []string{patGPT2}},
	// llama.cpp's default (a gpt2 file with no tokenizer.ggml.pre, as older converters wrote):
	// its fourth regex cuts what is left of a digit run into threes from the left ("12345" is
	// "123", "45").
	{names: []string{"default", ""}, regexes: []string{`[\p{P}\$\+<=>\^~\|]+`, patGPT2, `\p{N}+`, `[0-9][0-9][0-9]`}},
	{names: []string{"deepseek-llm"}, regexes: []string{`[\r\n]`, patDeepSeekLetters,
		"\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", `\s+$`, "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", `\p{N}+`}},
	{names: []string{"deepseek-coder"}, regexes: []string{`[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", `\p{N}`}},
	{names: []string{"deepseek-v3"}, regexes: []string{`\p{N}{1,3}`, "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", patDeepSeekV3}},
	{names: []string{"falcon"}, regexes: []string{"[\\p{P}\\$\\+<=>\\^~\\|`]+", patGPT2, `[0-9][0-9][0-9]`}},
	{names: []string{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
		regexes: []string{`\p{N}`, patGPT2}},
	{names: []string{"bloom", "poro-chat", "gpt3-finnish"}, regexes: []string{patBloom}},
	{names: []string{"viking"}, regexes: []string{patBloom, `\p{N}`}},
	{names: []string{"tekken"}, regexes: []string{patTekken}, ignoreMerges: true, addBOS: true},
	{names: []string{"gpt-4o", "llama4"}, regexes: []string{patGPT4o}},
	{names: []string{"chameleon"}, regexes: []string{`<sentinel:[0-9]+>`, `(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z`,
		`([\t\n]|    |  )`, `\p{N}`, "[\\p{P}!-/:-@\\[-`{-~]", patGPT2}, addBOS: true},
	{names: []string{"superbpe"}, regexes: []string{`\p{N}+`, patThousands}},
}

// PreTokenizers lists the tokenizer.ggml.pre values this package supports, sorted.
func PreTokenizers() []string {
	var out []string
	for _, f := range preFamilies {
		for _, n := range f.names {
			if n != "" {
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// ErrUnknownPreTokenizer is returned (wrapping core.ErrUnsupported) for a tokenizer.ggml.pre
// value outside PreTokenizers: guessing a pattern would silently give the model ids it was not
// trained on, so the file is refused instead, as llama.cpp does.
var ErrUnknownPreTokenizer = fmt.Errorf("unknown BPE pre-tokenizer: %w", core.ErrUnsupported)

func lookupPre(name string) (*preFamily, error) {
	for i := range preFamilies {
		for _, n := range preFamilies[i].names {
			if n == name {
				return &preFamilies[i], nil
			}
		}
	}
	return nil, fmt.Errorf("tokenizer: tokenizer.ggml.pre %q (supported: %s): %w", name, strings.Join(PreTokenizers(), ", "),
		ErrUnknownPreTokenizer)
}

// splitter cuts text into pre-tokens whose concatenation is the text.
type splitter interface {
	split(text string) []string
}

// regexMatchTimeout bounds one regex search: a backtracking engine can take quadratic time on a
// long run of spaces ("\s+$" retries from every position), and a prompt must not hang the
// server. On timeout the rest of the piece stays whole (still a valid, if longer, tokenization).
const regexMatchTimeout = 2 * time.Second

// splitStep cuts the piece rs[p[0]:p[1]] into rune ranges appended to out.
type splitStep func(rs []rune, p [2]int, out [][2]int) [][2]int

// handSteps are hand-written equivalents of the most used patterns, run instead of them: about
// ten times faster than regexp2 (BenchmarkPreTokenize), and held equal to the patterns by
// TestHandSplittersMatchRegexes and FuzzPreTokenizers. The GPT-2, Llama 3, Qwen2 and \p{N}
// steps cover the Llama 3, Qwen2, GPT-2 and StarCoder groups whole and Falcon's and the
// default's middle step. patThousands' lookahead is also quadratic on regexp2: it rescans the
// rest of a digit run at every position, so a 16,000-digit number took 45 s (no single search
// reaches the match timeout).
var handSteps = map[string]splitStep{
	patGPT2:      handSplitter{gpt2: true}.step,
	patLlama3:    handSplitter{maxDigits: 3}.step,
	patQwen2:     handSplitter{maxDigits: 1}.step,
	`\p{N}`:      isolateNumbers,
	patThousands: splitThousands,
}

// isolateNumbers is \p{N} split isolated: every number character a piece of its own.
func isolateNumbers(rs []rune, p [2]int, out [][2]int) [][2]int {
	last := p[0]
	for i := p[0]; i < p[1]; i++ {
		if unicode.IsNumber(rs[i]) {
			if i > last {
				out = append(out, [2]int{last, i})
			}
			out = append(out, [2]int{i, i + 1})
			last = i + 1
		}
	}
	if last < p[1] {
		out = append(out, [2]int{last, p[1]})
	}
	return out
}

// regexSplitter runs a family's regexes in turn.
type regexSplitter struct {
	steps []splitStep
}

// newRegexSplitter compiles pats; with hand, a pattern that has a hand-written step runs that.
func newRegexSplitter(pats []string, hand bool) (*regexSplitter, error) {
	s := &regexSplitter{}
	for _, p := range pats {
		if h, ok := handSteps[p]; ok && hand {
			s.steps = append(s.steps, h)
			continue
		}
		re, err := regexp2.Compile(p, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: pre-tokenizer regex %q: %w", p, err)
		}
		re.MatchTimeout = regexMatchTimeout
		s.steps = append(s.steps, func(rs []rune, p [2]int, out [][2]int) [][2]int {
			return splitIsolated(re, rs, p, out)
		})
	}
	return s, nil
}

// splitThousands is patThousands: a zero-width cut before every position where the run of
// decimal digits (\d: Unicode Nd) that starts there has a length that is a multiple of 3.
func splitThousands(rs []rune, p [2]int, out [][2]int) [][2]int {
	last := p[0]
	run := 0 // length of the digit run starting at i, computed right to left
	cuts := make([]int, 0, 4)
	for i := p[1] - 1; i >= p[0]; i-- {
		if unicode.IsDigit(rs[i]) {
			run++
			if run%3 == 0 && i > p[0] {
				cuts = append(cuts, i)
			}
		} else {
			run = 0
		}
	}
	for k := len(cuts) - 1; k >= 0; k-- {
		out = append(out, [2]int{last, cuts[k]})
		last = cuts[k]
	}
	return append(out, [2]int{last, p[1]})
}

func (s *regexSplitter) split(text string) []string {
	// The regexes run on runes; pieces are cut from text at the matching byte offsets, so
	// bytes that are not UTF-8 (each one rune U+FFFD to the regexes) come out unchanged.
	rs := []rune(text)
	off := runeOffsets(text, len(rs))
	pieces := [][2]int{{0, len(rs)}}
	for _, step := range s.steps {
		var next [][2]int
		for _, p := range pieces {
			next = step(rs, p, next)
		}
		pieces = next
	}
	out := make([]string, len(pieces))
	for i, p := range pieces {
		out[i] = text[off[p[0]]:off[p[1]]]
	}
	return out
}

// runeOffsets returns the byte offset of each of the n runes of text, and len(text) last.
func runeOffsets(text string, n int) []int {
	off := make([]int, 0, n+1)
	for i := 0; i < len(text); {
		off = append(off, i)
		_, w := utf8.DecodeRuneInString(text[i:])
		i += w
	}
	return append(off, len(text))
}

// splitIsolated appends to out the matches of re in the piece rs[p[0]:p[1]] and the non-empty
// text between them, as rune ranges of rs.
func splitIsolated(re *regexp2.Regexp, rs []rune, p [2]int, out [][2]int) [][2]int {
	piece := rs[p[0]:p[1]]
	last := 0
	m, err := re.FindRunesMatch(piece)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		if m.Index > last {
			out = append(out, [2]int{p[0] + last, p[0] + m.Index})
		}
		if m.Length > 0 {
			out = append(out, [2]int{p[0] + m.Index, p[0] + m.Index + m.Length})
		}
		last = m.Index + m.Length
	}
	if err != nil {
		// Only a timeout can fail a match of these fixed patterns.
		slog.Warn("tokenizer: pre-tokenizer regex timed out; keeping the rest of the piece whole",
			"regex", re.String(), "runes", len(piece)-last, "err", err)
	}
	if last < len(piece) {
		out = append(out, [2]int{p[0] + last, p[1]})
	}
	return out
}

// newPreTokenizer returns the splitter of the family named pre: its regexes in turn, each by
// its hand-written step where it has one, or (regex) every one on regexp2 as published.
func newPreTokenizer(pre string, regex bool) (splitter, *preFamily, error) {
	fam, err := lookupPre(pre)
	if err != nil {
		return nil, nil, err
	}
	s, err := newRegexSplitter(fam.regexes, !regex)
	if err != nil {
		return nil, nil, err
	}
	return s, fam, nil
}

// withPre returns a copy of a BPE tokenizer that pre-tokenizes as the family pre does, sharing
// the vocabulary tables (building them again for a 128k vocabulary costs a second).
func (t *Tokenizer) withPre(pre string, regex bool) (*Tokenizer, error) {
	if t.v.Kind != BPE {
		return nil, fmt.Errorf("tokenizer: a pre-tokenizer needs a BPE vocabulary: %w", core.ErrInvalidArgument)
	}
	s, fam, err := newPreTokenizer(pre, regex)
	if err != nil {
		return nil, err
	}
	c := *t
	c.v.Pre, c.v.RegexPre = pre, regex
	c.pre, c.ignoreMerges = s, fam.ignoreMerges
	return &c, nil
}
