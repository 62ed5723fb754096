// Package tokenizer turns text into token ids and back, driven by the vocabulary embedded in a
// GGUF file, as llama.cpp reads it:
//
//   - SentencePiece ("llama": scores, byte fallback, spaces as ▁): Llama 2, Mistral, and Gemma,
//     whose files set tokenizer.ggml.add_space_prefix to false.
//   - GPT-2 byte-level BPE ("gpt2": merges) after a pre-tokenizer named by tokenizer.ggml.pre.
//   - WordPiece ("bert": BERT-style embedding models), longest piece first over lowercased,
//     accent-stripped words, with [CLS] and [SEP] around the text (wpm.go).
//
// The pre-tokenizers are the families llama.cpp recognises (PreTokenizers lists every name):
// Llama 3 (llama-bpe, dbrx, smaug-bpe, chatglm-bpe), Qwen2 (qwen2, stablelm2), GPT-2 (gpt-2,
// gpt-neox, mpt, olmo, jais, phi-2...), DeepSeek (deepseek-llm, deepseek-coder, deepseek-v3),
// Falcon, StarCoder (starcoder, refact, command-r, smollm, codeshell, exaone, minerva-7b),
// BLOOM (bloom, poro-chat, gpt3-finnish), Viking, Tekken, GPT-4o, Chameleon, SuperBPE and
// llama.cpp's "default". Each runs its published regexes in turn, as written, on regexp2 (Go's
// regexp has no lookahead); the most used patterns (Llama 3, Qwen2, GPT-2, \p{N}) have
// hand-written equivalents that give the same pieces about ten times faster
// (BenchmarkPreTokenize), which covers the Llama 3, Qwen2, GPT-2 and StarCoder groups. A name
// outside the table is refused with ErrUnknownPreTokenizer rather than guessed: a wrong split
// gives the model ids it never saw, which is worse than a clear error. A file with no
// tokenizer.ggml.pre gets llama.cpp's "default" and a warning (slog), as llama.cpp does.
//
// Control and user-defined tokens written in the text become their ids (ParseSpecial turns
// that off for control tokens); BOS is added when the file, or the family's default
// (Llama 3, Tekken, Chameleon), asks for it.
package tokenizer

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
)

// Kind is the tokenizer family.
type Kind int

// Tokenizer kinds, as tokenizer.ggml.model names them.
const (
	SentencePiece Kind = iota // "llama"
	BPE                       // "gpt2"
	WordPiece                 // "bert"
)

// Token types, as tokenizer.ggml.token_type.
const (
	TypeNormal      = 1
	TypeUnknown     = 2
	TypeControl     = 3
	TypeUserDefined = 4
	TypeUnused      = 5
	TypeByte        = 6
)

// Vocab is what a tokenizer is built from; FromGGUF fills it from tokenizer.ggml.* keys.
type Vocab struct {
	Kind   Kind
	Tokens []string
	Scores []float32 // SentencePiece merge priority (higher first)
	Types  []int32   // per token; nil means all normal
	Merges []string  // BPE merges "a b", best first
	// Pre names the BPE pre-tokenizer (tokenizer.ggml.pre), one of PreTokenizers().
	Pre string
	// RegexPre runs the pre-tokenizer's published regexes even where a faster hand-written
	// splitter exists (for tests and benchmarks: both give the same pieces).
	RegexPre      bool
	BOS, EOS, UNK int32 // -1 when absent
	// SEP is WordPiece's separator, which Encode with AddSpecial appends after the text (BOS is
	// BERT's [CLS] there); -1 when absent. Other kinds ignore it.
	SEP            int32
	AddBOS         bool
	AddSpacePrefix bool    // SentencePiece dummy prefix
	StopTokens     []int32 // extra end-of-generation ids (EOT, im_end ...)
}

// Tokenizer encodes and decodes. It is immutable and safe for concurrent use.
type Tokenizer struct {
	v       Vocab
	index   map[string]int32
	bytes   [256]int32 // byte-fallback (SentencePiece) or byte-level (BPE) token of each byte
	ranks   map[[2]string]int
	special []string        // control and user-defined tokens matched literally in text, longest first
	control map[string]bool // which of special are control tokens
	pre     splitter
	// ignoreMerges: a pre-token found whole in the vocabulary is one token (Llama 3, Tekken).
	ignoreMerges bool
	// maxTokenLen is the longest token in bytes: WordPiece's longest-match bound.
	maxTokenLen int
}

// New validates a vocabulary and builds the lookup tables.
func New(v Vocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary: %w", core.ErrInvalidArgument)
	}
	if v.Scores != nil && len(v.Scores) != n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens: %w", len(v.Scores), n, core.ErrInvalidArgument)
	}
	if v.Types != nil && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens: %w", len(v.Types), n, core.ErrInvalidArgument)
	}
	ids := append([]int32{v.BOS, v.EOS, v.UNK}, v.StopTokens...)
	if v.Kind == WordPiece {
		ids = append(ids, v.SEP)
	}
	for _, id := range ids {
		if id < -1 || int(id) >= n {
			return nil, fmt.Errorf("tokenizer: special token id %d outside the vocabulary of %d: %w", id, n, core.ErrInvalidArgument)
		}
	}
	t := &Tokenizer{v: v, index: make(map[string]int32, n), control: map[string]bool{}}
	for i, s := range v.Tokens {
		if _, dup := t.index[s]; !dup {
			t.index[s] = int32(i)
		}
		if tt := t.typ(int32(i)); (tt == TypeControl || tt == TypeUserDefined) && s != "" {
			t.special = append(t.special, s)
			t.control[s] = t.control[s] || tt == TypeControl
		}
	}
	sort.Slice(t.special, func(a, b int) bool { return len(t.special[a]) > len(t.special[b]) })
	for b := range t.bytes {
		t.bytes[b] = -1
	}
	switch v.Kind {
	case SentencePiece:
		for b := range t.bytes {
			if id, ok := t.index[fmt.Sprintf("<0x%02X>", b)]; ok {
				t.bytes[b] = id
			}
		}
	case BPE:
		for b := range t.bytes {
			if id, ok := t.index[string(byteToRune[b])]; ok {
				t.bytes[b] = id
			}
		}
		t.ranks = make(map[[2]string]int, len(v.Merges))
		for r, m := range v.Merges {
			a, b, ok := strings.Cut(m, " ")
			if !ok {
				return nil, fmt.Errorf("tokenizer: merge %d %q is not two symbols: %w", r, m, core.ErrInvalidArgument)
			}
			if _, dup := t.ranks[[2]string{a, b}]; !dup {
				t.ranks[[2]string{a, b}] = r
			}
		}
		pre, fam, err := newPreTokenizer(v.Pre, v.RegexPre)
		if err != nil {
			return nil, err
		}
		t.pre, t.ignoreMerges = pre, fam.ignoreMerges
	case WordPiece:
		for _, s := range v.Tokens {
			t.maxTokenLen = max(t.maxTokenLen, len(s))
		}
	default:
		return nil, fmt.Errorf("tokenizer: kind %d: %w", v.Kind, core.ErrUnsupported)
	}
	return t, nil
}

// FromGGUF builds the tokenizer described by a file's tokenizer.ggml.* metadata.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	v := Vocab{BOS: -1, EOS: -1, UNK: -1, SEP: -1}
	noBOS := false
	model := str(f, "tokenizer.ggml.model")
	switch model {
	case "llama":
		v.Kind, v.AddBOS, v.AddSpacePrefix = SentencePiece, true, true
	case "gpt2":
		v.Kind, v.Pre = BPE, str(f, "tokenizer.ggml.pre")
		fam, err := lookupPre(v.Pre)
		if err != nil {
			return nil, err
		}
		if v.Pre == "" {
			slog.Warn("tokenizer: the file names no tokenizer.ggml.pre; using llama.cpp's default pre-tokenizer, which may not be the model's")
		}
		v.AddBOS = fam.addBOS
		noBOS = fam.noBOS
	case "bert":
		// llama.cpp's defaults are BERT's ids ([CLS] 101, [UNK] 100, [SEP] 102), which the keys
		// below override; [CLS] and [SEP] frame the text whatever add_bos_token says.
		v.Kind, v.AddBOS, v.BOS, v.UNK, v.SEP = WordPiece, true, 101, 100, 102
	case "":
		return nil, fmt.Errorf("tokenizer: the file has no tokenizer.ggml.model: %w", core.ErrNotFound)
	default:
		return nil, fmt.Errorf("tokenizer: model %q (known: llama, gpt2, bert): %w", model, core.ErrUnsupported)
	}
	val, _ := f.Get("tokenizer.ggml.tokens")
	toks, ok := val.Strings()
	if !ok {
		return nil, fmt.Errorf("tokenizer: tokenizer.ggml.tokens is missing or not a string array: %w", core.ErrInvalidArgument)
	}
	v.Tokens = toks
	if v.Kind == WordPiece {
		// A default id past a small vocabulary is no token of it (the keys may name others).
		for _, dst := range []*int32{&v.BOS, &v.UNK, &v.SEP} {
			if int(*dst) >= len(toks) {
				*dst = -1
			}
		}
	}
	if val, ok := f.Get("tokenizer.ggml.scores"); ok {
		if v.Scores, ok = val.Float32s(); !ok {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.scores is not an f32 array: %w", core.ErrInvalidArgument)
		}
	}
	if val, ok := f.Get("tokenizer.ggml.token_type"); ok {
		ints, ok := val.Ints()
		if !ok {
			return nil, fmt.Errorf("tokenizer: tokenizer.ggml.token_type is not an integer array: %w", core.ErrInvalidArgument)
		}
		v.Types = make([]int32, len(ints))
		for i, x := range ints {
			v.Types[i] = int32(x)
		}
	}
	if val, ok := f.Get("tokenizer.ggml.merges"); ok {
		v.Merges, _ = val.Strings()
	}
	// A special id the file names but the vocabulary lacks is an error naming the key: dropping
	// it would report "no BOS token" for a file that has one, only out of range.
	var idErr error
	id := func(key string, dst *int32) {
		val, ok := f.Get(key)
		if !ok || idErr != nil {
			return
		}
		x, ok := val.Int()
		if !ok || x < 0 || x >= int64(len(toks)) {
			idErr = fmt.Errorf("tokenizer: %s = %v is outside the vocabulary of %d tokens: %w",
				key, val.Any(), len(toks), core.ErrInvalidArgument)
			return
		}
		*dst = int32(x)
	}
	id("tokenizer.ggml.bos_token_id", &v.BOS)
	id("tokenizer.ggml.eos_token_id", &v.EOS)
	id("tokenizer.ggml.unknown_token_id", &v.UNK)
	if v.Kind == WordPiece {
		// Only WordPiece uses it; other files often write 0xFFFFFFFF there for "none".
		id("tokenizer.ggml.seperator_token_id", &v.SEP) // sic: the key as GGUF spells it
	}
	for _, key := range []string{"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"} {
		x := int32(-1)
		id(key, &x)
		if x >= 0 {
			v.StopTokens = append(v.StopTokens, x)
		}
	}
	if idErr != nil {
		return nil, idErr
	}
	if noBOS {
		v.BOS = -1
	}
	// llama.cpp also ends generation on the end-of-turn tokens of chat vocabularies, which the
	// metadata often does not name.
	for i, s := range toks {
		if eogTexts[s] && (v.Types == nil || v.Types[i] == TypeControl || v.Types[i] == TypeUserDefined) &&
			int32(i) != v.EOS {
			v.StopTokens = append(v.StopTokens, int32(i))
		}
	}
	flag := func(key string, dst *bool) {
		if val, ok := f.Get(key); ok {
			if b, ok := val.Bool(); ok {
				*dst = b
			}
		}
	}
	if v.Kind != WordPiece {
		flag("tokenizer.ggml.add_bos_token", &v.AddBOS)
	}
	flag("tokenizer.ggml.add_space_prefix", &v.AddSpacePrefix)
	return New(v)
}

// eogTexts are end-of-turn token texts of common chat vocabularies.
var eogTexts = map[string]bool{"<|eot_id|>": true, "<|eom_id|>": true, "<|im_end|>": true,
	"<|end|>": true, "<end_of_turn>": true, "<|endoftext|>": true}

func str(f *gguf.File, key string) string {
	v, _ := f.Get(key)
	s, _ := v.Str()
	return s
}

// Vocab returns the vocabulary the tokenizer was built from.
func (t *Tokenizer) Vocab() *Vocab { return &t.v }

// Size is the number of tokens.
func (t *Tokenizer) Size() int { return len(t.v.Tokens) }

// BOS is the beginning-of-sequence id, -1 if none.
func (t *Tokenizer) BOS() int32 { return t.v.BOS }

// EOS is the end-of-sequence id, -1 if none.
func (t *Tokenizer) EOS() int32 { return t.v.EOS }

// IsStop reports whether id ends generation (EOS or one of the model's stop tokens).
func (t *Tokenizer) IsStop(id int32) bool {
	if id == t.v.EOS && id >= 0 {
		return true
	}
	for _, s := range t.v.StopTokens {
		if s == id {
			return true
		}
	}
	return false
}

func (t *Tokenizer) typ(id int32) int32 {
	if t.v.Types == nil || id < 0 || int(id) >= len(t.v.Types) {
		return TypeNormal
	}
	return t.v.Types[id]
}

// Encode tokenizes text. With addSpecial, BOS is prepended when the vocabulary asks for it.
// Control and user-defined tokens written literally in text ("<|im_start|>") become their ids.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	return t.EncodeWith(text, AddSpecial(addSpecial))
}

// EncodeOption changes what EncodeWith does.
type EncodeOption func(*encodeOptions)

type encodeOptions struct {
	addSpecial, parseSpecial bool
	plain                    [][2]int
}

// inPlain says whether bytes [start, end) of the text meet a PlainSpans range.
func (o *encodeOptions) inPlain(start, end int) bool {
	for _, p := range o.plain {
		if start < p[1] && end > p[0] {
			return true
		}
	}
	return false
}

// AddSpecial prepends BOS when the vocabulary asks for it (tokenizer.ggml.add_bos_token, or
// the pre-tokenizer family's default). Off by default.
func AddSpecial(on bool) EncodeOption { return func(o *encodeOptions) { o.addSpecial = on } }

// ParseSpecial makes the text of a control token written in the text ("<|im_end|>") that token
// (on by default). Off, it is encoded as plain text: for text from a user that must not be able
// to close a chat turn. User-defined tokens are matched either way, as llama.cpp does.
func ParseSpecial(on bool) EncodeOption { return func(o *encodeOptions) { o.parseSpecial = on } }

// PlainSpans marks byte ranges [start, end) of the text in which control tokens are not parsed
// (a chat message's content inside the rendered prompt): a control token's text that meets one
// is encoded as plain text, as ParseSpecial(false) does for a whole text, while control tokens
// elsewhere still become their ids. The text is not cut at the ranges' edges, so a text whose
// ranges spell no control token encodes exactly as without the option.
func PlainSpans(spans ...[2]int) EncodeOption {
	return func(o *encodeOptions) { o.plain = append(o.plain, spans...) }
}

// EncodeWith tokenizes text as the options say.
func (t *Tokenizer) EncodeWith(text string, opts ...EncodeOption) []int32 {
	o := encodeOptions{parseSpecial: true}
	for _, opt := range opts {
		opt(&o)
	}
	var out []int32
	if o.addSpecial && t.v.AddBOS && t.v.BOS >= 0 {
		out = append(out, t.v.BOS)
	}

	// Special tokens cut the text into pieces encoded on their own; SentencePiece's dummy
	// space goes before each, as llama.cpp and Hugging Face's (legacy) Llama tokenizer do.
	base := 0 // where text starts in the caller's text (for PlainSpans)
	for len(text) > 0 {
		pos, sp := t.nextSpecialIn(text, base, &o)
		if pos > 0 {
			out = t.encodeText(out, text[:pos])
		}
		if sp == "" {
			break
		}
		out = append(out, t.index[sp])
		text = text[pos+len(sp):]
		base += pos + len(sp)
	}
	if o.addSpecial && t.v.Kind == WordPiece && t.v.SEP >= 0 {
		out = append(out, t.v.SEP)
	}
	return out
}

// ControlText returns the first control token's text written literally in s ("<|im_end|>"),
// or "" when there is none: such text in a chat message would close a turn if parsed.
func (t *Tokenizer) ControlText(s string) string {
	if _, sp := t.nextSpecial(s, true); sp != "" && t.control[sp] {
		return sp
	}
	return ""
}

// nextSpecial finds the earliest special token in s (longest at that position), control tokens
// only if control; pos is len(s) when none occurs.
func (t *Tokenizer) nextSpecial(s string, control bool) (int, string) {
	return t.nextSpecialIn(s, 0, &encodeOptions{parseSpecial: control})
}

// nextSpecialIn is nextSpecial for s starting at byte base of the whole text, skipping control
// tokens that meet o's plain spans.
func (t *Tokenizer) nextSpecialIn(s string, base int, o *encodeOptions) (int, string) {
	best, bestTok := len(s), ""
	for _, sp := range t.special {
		ctl := t.control[sp]
		if !o.parseSpecial && ctl {
			continue
		}
		for from := 0; from <= best; {
			i := strings.Index(s[from:], sp)
			if i < 0 {
				break
			}
			i += from
			if ctl && len(o.plain) > 0 && o.inPlain(base+i, base+i+len(sp)) {
				from = i + 1
				continue
			}
			if i < best || (i == best && len(sp) > len(bestTok)) {
				best, bestTok = i, sp
			}
			break
		}
	}
	return best, bestTok
}

func (t *Tokenizer) encodeText(out []int32, text string) []int32 {
	switch t.v.Kind {
	case SentencePiece:
		return t.encodeSPM(out, text)
	case WordPiece:
		return t.encodeWPM(out, text)
	}
	for _, word := range t.pre.split(text) {
		out = t.encodeBPEWord(out, word)
	}
	return out
}

// Piece is the text of one token as Decode writes it (byte tokens give their raw byte).
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.v.Tokens) {
		return ""
	}
	switch t.typ(id) {
	case TypeControl, TypeUnknown, TypeUnused:
		return ""
	}
	s := t.v.Tokens[id]
	if t.v.Kind == SentencePiece {
		if t.typ(id) == TypeByte || isByteToken(s) {
			if b, ok := parseByteToken(s); ok {
				return string([]byte{b})
			}
		}
		return strings.ReplaceAll(s, spmSpace, " ")
	}
	if t.v.Kind == WordPiece {
		return strings.ReplaceAll(s, spmSpace, " ")
	}
	if t.typ(id) == TypeUserDefined {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if by, ok := runeToByte[r]; ok {
			b.WriteByte(by)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Decode turns ids into text. For SentencePiece the dummy-prefix space of the first token is
// dropped, as the text did not have it.
func (t *Tokenizer) Decode(ids []int32) string {
	d := t.NewDecoder()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(d.Next(id))
	}
	b.WriteString(d.Flush())
	return b.String()
}

// Decoder turns a stream of ids into text, holding back bytes of an incomplete UTF-8
// character until the rest arrives.
type Decoder struct {
	t       *Tokenizer
	pending []byte
	started bool
}

// NewDecoder starts a stream.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Next returns the text that id completes (possibly "").
func (d *Decoder) Next(id int32) string {
	p := d.t.Piece(id)
	if p == "" {
		return ""
	}
	if !d.started {
		d.started = true
		if (d.t.v.Kind == SentencePiece && d.t.v.AddSpacePrefix) || d.t.v.Kind == WordPiece {
			p = strings.TrimPrefix(p, " ")
		}
	}
	d.pending = append(d.pending, p...)
	// Emit everything up to the last complete character.
	n := len(d.pending)
	cut := n
	for i := n - 1; i >= 0 && i >= n-utf8.UTFMax; i-- {
		if utf8.RuneStart(d.pending[i]) {
			if !utf8.FullRune(d.pending[i:]) {
				cut = i
			}
			break
		}
	}
	out := string(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

// Flush returns what is held back (an incomplete character at the end of the stream).
func (d *Decoder) Flush() string {
	out := string(d.pending)
	d.pending = d.pending[:0]
	return out
}
