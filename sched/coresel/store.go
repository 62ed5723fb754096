package coresel

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xpuhub/xpu/internal/cachedir"
	"github.com/xpuhub/xpu/internal/safefile"
	"github.com/xpuhub/xpu/sched/cputopo"
)

// ErrNoRecord is wrapped when no tuning result is stored for a fingerprint.
var ErrNoRecord = errors.New("coresel: no stored tuning result")

// Record is a persisted tuning result: the paper tunes once per device and reuses the result
// for every model, so the key is the device fingerprint (and, for simulations, the SoC).
type Record struct {
	Fingerprint string    `json:"fingerprint"`
	Device      string    `json:"device"`          // topology summary
	Mode        string    `json:"mode"`            // "measured" or "simulated:<soc>"
	Meter       string    `json:"meter"`           // the meter every energy figure came from
	Modelled    bool      `json:"energy_modelled"` // energy figures are a model's, not a meter's
	Model       string    `json:"model"`           // the model trials decoded (or the SoC workload)
	Tokens      int       `json:"tokens"`          // decode tokens per trial
	Decode      string    `json:"decode"`          // selection key, e.g. "0+2+0"
	DecodeCPUs  string    `json:"decode_cpus"`     // the neon cpus= option
	DecodeWords string    `json:"decode_words"`
	Prefill     string    `json:"prefill"`
	PrefillCPUs string    `json:"prefill_cpus"`
	Created     time.Time `json:"created"`
	Result      *Result   `json:"result"`
}

// CacheDir is where tuning results live: $XPU_CACHE_DIR, else $XDG_CACHE_HOME/xpu, else
// ~/.cache/xpu (the same order as the OpenCL plugin's program cache), plus "aecs".
func CacheDir() (string, error) {
	d, err := cachedir.Dir("aecs")
	if err != nil {
		return "", fmt.Errorf("coresel: %w", err)
	}
	return d, nil
}

// Fingerprint identifies a device for the cache: its clusters (types, sizes, frequencies,
// capacities, governors), the kernel release read under the topology's root, and extra
// (the simulated SoC's name, say). A kernel or firmware update that changes any of these asks
// for a new tuning, which is what the paper's once-per-device rule needs.
func Fingerprint(top *cputopo.Topology, extra ...string) string {
	h := sha256.New()
	for _, c := range top.Clusters {
		fmt.Fprintf(h, "%s|%d|%d|%d|%s|%v;", c.Type, c.Size(), c.MaxFreqKHz, c.Capacity, c.Governor, c.Efficiency)
	}
	if top.Root != "" {
		b, _ := os.ReadFile(filepath.Join(top.Root, "proc/sys/kernel/osrelease"))
		fmt.Fprintf(h, "kernel=%s;", strings.TrimSpace(string(b)))
	}
	for _, e := range extra {
		fmt.Fprintf(h, "%s;", e)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Save writes r to dir/<fingerprint>.json (atomically: a temporary file renamed).
func Save(dir string, r Record) (string, error) {
	if r.Fingerprint == "" || strings.ContainsAny(r.Fingerprint, `/\.`) {
		return "", fmt.Errorf("coresel: save: bad fingerprint %q", r.Fingerprint)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("coresel: save: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("coresel: save: %w", err)
	}
	path := filepath.Join(dir, r.Fingerprint+".json")
	tmp, err := os.CreateTemp(dir, ".aecs-*")
	if err != nil {
		return "", fmt.Errorf("coresel: save: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("coresel: save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("coresel: save: %w", err)
	}
	return path, nil
}

// Load reads the record stored for fingerprint (ErrNoRecord when there is none).
func Load(dir, fingerprint string) (Record, error) {
	var r Record
	b, err := safefile.ReadFile(filepath.Join(dir, fingerprint+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("%w for %s in %s", ErrNoRecord, fingerprint, dir)
	}
	if err != nil {
		return r, fmt.Errorf("coresel: load: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("coresel: load %s: %w", fingerprint, err)
	}
	if r.Fingerprint != fingerprint {
		return r, fmt.Errorf("coresel: load: %s holds fingerprint %q", fingerprint, r.Fingerprint)
	}
	return r, nil
}

// NewRecord fills a record from a result.
func NewRecord(top *cputopo.Topology, res *Result, fingerprint, mode, meter, model string, tokens int) (Record, error) {
	dc, err := res.Decode.CPUs(top)
	if err != nil {
		return Record{}, err
	}
	pc, err := res.Prefill.CPUs(top)
	if err != nil {
		return Record{}, err
	}
	return Record{Fingerprint: fingerprint, Device: top.String(), Mode: mode, Meter: meter, Modelled: res.Modelled,
		Model: model, Tokens: tokens, Decode: res.Decode.Key(), DecodeCPUs: cputopo.FormatCPUList(dc),
		DecodeWords: res.Decode.Describe(top), Prefill: res.Prefill.Key(), PrefillCPUs: cputopo.FormatCPUList(pc),
		Created: time.Now().UTC(), Result: res}, nil
}

// MeasuredFingerprint is the fingerprint under which `xpu tune --energy` stores a measured
// result for backend on the device top describes, and which `xpu run` looks up.
func MeasuredFingerprint(top *cputopo.Topology, backend string) string {
	return Fingerprint(top, "measured", backend)
}

// LoadMeasured reads the measured result stored for backend on the device top describes, from
// CacheDir, and says which file it read (ErrNoRecord when there is none).
func LoadMeasured(top *cputopo.Topology, backend string) (Record, string, error) {
	dir, err := CacheDir()
	if err != nil {
		return Record{}, "", err
	}
	fp := MeasuredFingerprint(top, backend)
	r, err := Load(dir, fp)
	return r, filepath.Join(dir, fp+".json"), err
}
