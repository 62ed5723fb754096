package draft

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/cachedir"
	"github.com/xpuhub/xpu/internal/safefile"
)

// ErrCorrupt: a history store's file is not one this package wrote (bad magic, a truncated
// record, a checksum or token out of range).
var ErrCorrupt = errors.New("draft: corrupt history store")

// historyMagic starts a history file; the version is its last byte.
const historyMagic = "XPUHIST1"

// DefaultHistoryTokens bounds a task's stored answers: older answers are dropped first.
const DefaultHistoryTokens = 1 << 16

// History is the persistent store of one task's earlier answers: token sequences in a file under
// the cache dir, keyed by task and model, read when a generation starts and appended to when it
// ends, bounded by a token budget (the oldest answers go first).
//
// File format (little-endian): "XPUHIST1", uint32 vocabulary size, then records of uint32 n,
// n int32 tokens and the CRC-32 (IEEE) of those token bytes.
type History struct {
	path    string
	vocab   int
	limit   int
	answers [][]int32
}

// CacheDir is where history stores live: $XPU_CACHE_DIR, else $XDG_CACHE_HOME/xpu, else
// ~/.cache/xpu (the project's cache root, as the plugins and xpu tune use it), plus "spec".
func CacheDir() (string, error) {
	d, err := cachedir.Dir("spec")
	if err != nil {
		return "", fmt.Errorf("draft: %w", err)
	}
	return d, nil
}

// HistoryPath is the file of task's store for a model (model: any string that identifies the
// model's vocabulary, e.g. a hash of its tokens) under dir.
func HistoryPath(dir, task, model string) string {
	h := sha256.Sum256([]byte(model + "\x00" + task))
	safe := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, task)
	if len(safe) > 32 {
		safe = safe[:32]
	}
	return filepath.Join(dir, safe+"-"+hex.EncodeToString(h[:8])+".hist")
}

// OpenHistory reads the store at path (none yet is an empty store) for a vocabulary of vocab
// tokens, keeping at most limit tokens (0: DefaultHistoryTokens). A file that does not parse is
// an error wrapping ErrCorrupt, and the returned store is then empty and usable: the caller may
// go on without the old answers, and the next Add replaces the file.
func OpenHistory(path string, vocab, limit int) (*History, error) {
	if limit <= 0 {
		limit = DefaultHistoryTokens
	}
	h := &History{path: path, vocab: vocab, limit: limit}
	data, err := safefile.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("draft: history %s: %w", path, err)
	}
	answers, err := ParseHistory(data, vocab)
	if err != nil {
		return h, fmt.Errorf("draft: history %s: %w", path, err)
	}
	h.answers = answers
	h.trim()
	return h, nil
}

// Answers are the stored answers, oldest first (shared: do not modify).
func (h *History) Answers() [][]int32 { return h.answers }

// Path is the store's file.
func (h *History) Path() string { return h.path }

// Add appends an answer, drops the oldest beyond the budget and rewrites the file (through a
// temporary file and a rename, so a crash leaves the old file or the new one).
func (h *History) Add(answer []int32) error {
	for _, t := range answer {
		if t < 0 || int(t) >= h.vocab {
			return fmt.Errorf("draft: history: token %d outside the vocabulary of %d: %w", t, h.vocab, core.ErrInvalidArgument)
		}
	}
	if len(answer) == 0 {
		return nil
	}
	h.answers = append(h.answers, append([]int32(nil), answer...))
	h.trim()
	if err := os.MkdirAll(filepath.Dir(h.path), 0o755); err != nil {
		return fmt.Errorf("draft: history: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(h.path), ".hist-*")
	if err != nil {
		return fmt.Errorf("draft: history: %w", err)
	}
	_, werr := tmp.Write(EncodeHistory(h.answers, h.vocab))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("draft: history: %w", err)
	}
	if err := os.Rename(tmp.Name(), h.path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("draft: history: %w", err)
	}
	return nil
}

// trim drops the oldest answers until the rest fit the budget (the newest is cut to it).
func (h *History) trim() {
	total := 0
	for i := len(h.answers) - 1; i >= 0; i-- {
		total += len(h.answers[i])
		if total > h.limit {
			if i == len(h.answers)-1 {
				a := h.answers[i]
				h.answers = [][]int32{a[len(a)-h.limit:]}
				return
			}
			h.answers = h.answers[i+1:]
			return
		}
	}
}

// EncodeHistory is the file image of answers (see History).
func EncodeHistory(answers [][]int32, vocab int) []byte {
	var b bytes.Buffer
	b.WriteString(historyMagic)
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(vocab)))
	for _, a := range answers {
		rec := make([]byte, 4*len(a))
		for i, t := range a {
			binary.LittleEndian.PutUint32(rec[4*i:], uint32(t))
		}
		b.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(a))))
		b.Write(rec)
		b.Write(binary.LittleEndian.AppendUint32(nil, crc32.ChecksumIEEE(rec)))
	}
	return b.Bytes()
}

// ParseHistory reads a history file image for a vocabulary of vocab tokens; anything but a
// well-formed file of that vocabulary is an error wrapping ErrCorrupt.
func ParseHistory(data []byte, vocab int) ([][]int32, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(data) < len(historyMagic)+4 || string(data[:len(historyMagic)]) != historyMagic {
		return nil, bad("no %q header", historyMagic)
	}
	if v := binary.LittleEndian.Uint32(data[len(historyMagic):]); int64(v) != int64(vocab) {
		return nil, bad("written for a vocabulary of %d tokens, the model has %d", v, vocab)
	}
	var out [][]int32
	rest := data[len(historyMagic)+4:]
	for len(rest) > 0 {
		if len(rest) < 4 {
			return nil, bad("truncated record header")
		}
		n := int64(binary.LittleEndian.Uint32(rest))
		rest = rest[4:]
		if n*4+4 > int64(len(rest)) {
			return nil, bad("record of %d tokens past the end of the file", n)
		}
		rec := rest[:n*4]
		if crc32.ChecksumIEEE(rec) != binary.LittleEndian.Uint32(rest[n*4:]) {
			return nil, bad("record %d: checksum mismatch", len(out))
		}
		a := make([]int32, n)
		for i := range a {
			a[i] = int32(binary.LittleEndian.Uint32(rec[4*i:]))
			if a[i] < 0 || int(a[i]) >= vocab {
				return nil, bad("record %d: token %d outside the vocabulary of %d", len(out), a[i], vocab)
			}
		}
		out = append(out, a)
		rest = rest[n*4+4:]
	}
	return out, nil
}
