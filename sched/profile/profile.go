// Package profile holds per-unit latency profiles: for each unit, the time of each op class
// (MATMUL per weight shape and dtype, ATTENTION, RMS_NORM, ROPE, ELEMENTWISE) over a grid of
// row counts (chunk lengths 1…1024), the unit's shape rules (static row counts, row alignment),
// its memory bandwidth alone, the bandwidth all units reach together and the cross-unit sync
// cost. A profile is measured on real units (Measure, `xpu tune --profile`) or tabulated from
// an SoC description (package soc; its Source says "simulated:<soc>" and every figure from it
// is a prediction). The solver reads only profiles, so it serves both.
//
// The JSON format is documented in README.md next to this file.
package profile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/cachedir"
	"github.com/xpuhub/xpu/internal/safefile"
)

// Version is the format version Parse accepts.
const Version = 1

// Sentinel errors.
var (
	// ErrBadProfile is wrapped by every error about a malformed profile (wraps
	// core.ErrInvalidArgument).
	ErrBadProfile = fmt.Errorf("profile: malformed: %w", core.ErrInvalidArgument)
	// ErrNoEntry is wrapped when a profile has no entry for an op class on a unit.
	ErrNoEntry = errors.New("profile: no entry")
	// ErrRefused is wrapped when the unit refused the op when it was profiled (wraps
	// core.ErrUnsupported).
	ErrRefused = fmt.Errorf("profile: refused by the unit: %w", core.ErrUnsupported)
	// ErrNoProfile is wrapped by Load when nothing is stored under a key.
	ErrNoProfile = errors.New("profile: none stored")
)

// Profile is a set of unit profiles for one model's shapes.
type Profile struct {
	Version int `json:"version"`
	// Source is "measured" or "simulated:<soc>".
	Source string `json:"source"`
	// Key identifies the profile in the cache (see Key).
	Key     string    `json:"key,omitempty"`
	Model   Model     `json:"model"`
	Created time.Time `json:"created"`
	Units   []Unit    `json:"units"`
	// CombinedGBs is the DRAM bandwidth all units reach when they stream weights together
	// (0: not known, no cap beyond each unit's own).
	CombinedGBs float64 `json:"combined_gbs,omitempty"`
	// SyncSeconds is the cost of a handoff between two units (a task on one unit waiting for
	// another's output), per ordered pair; a pair not listed costs DefaultSyncSeconds.
	Sync []Sync `json:"sync,omitempty"`
	// DefaultSyncSeconds is the handoff cost of pairs Sync does not list.
	DefaultSyncSeconds float64 `json:"default_sync_s"`
	// Notes say where figures come from (sources of a simulated profile, the machine load of
	// a measured one).
	Notes []string `json:"notes,omitempty"`

	idx index
}

// Unit is one unit's profile.
type Unit struct {
	// Name is the unit spec ("neon{cpus=0,threads=1}", "opencl:0") or, simulated, the
	// description's unit name ("npu").
	Name   string `json:"name"`
	Kind   string `json:"kind"` // cpu, gpu, npu, accel
	Device string `json:"device,omitempty"`
	// Build is the plugin's build ID (measured) or the description's version (simulated).
	Build string `json:"build,omitempty"`
	// LaunchSeconds is the fixed cost of one op (submission, dispatch): the part of a time
	// that does not shrink when an op is split.
	LaunchSeconds float64 `json:"launch_s"`
	// GBs is the DRAM bandwidth the unit reaches alone streaming weights (0: unknown).
	GBs float64 `json:"gbs,omitempty"`
	// StaticM lists the only row counts the unit runs (static graphs, precompiled); a query
	// for other M is padded up to the next, or cut into runs of the largest. Empty: any M.
	StaticM []int `json:"static_m,omitempty"`
	// RowAlign is the granularity of row-cut splits of N on this unit (0: 1).
	RowAlign int `json:"row_align,omitempty"`
	// SharedSlowdown is how many times slower the unit runs while the other units run too
	// (cores or memory they share; 0 or 1: not slowed).
	SharedSlowdown float64 `json:"shared_slowdown,omitempty"`
	// Jitter is how much the unit's op times vary from run to run while the other units run
	// (the mean absolute deviation over the median: other processes preempting it, contention).
	// The parts of a split, meant to end together, then end apart, and the first waits for the
	// last: the solver charges a split that wait (0: steady).
	Jitter  float64 `json:"jitter,omitempty"`
	Entries []Entry `json:"entries"`
}

// Entry is one timed op. Shapes: MATMUL x[M,K]·W[N,K]ᵀ of DType; ATTENTION M query rows over
// K key/value rows with N = heads·head_dim; RMS_NORM, ROPE, ELEMENTWISE over [M, N].
type Entry struct {
	Op    string `json:"op"`
	DType string `json:"dtype,omitempty"`
	M     int    `json:"m"`
	K     int    `json:"k,omitempty"`
	N     int    `json:"n"`
	// Seconds is the median time of one run (0 when Refused).
	Seconds float64 `json:"s"`
	// Refused is the unit's reason when it could not run the op.
	Refused string `json:"refused,omitempty"`
}

// Sync is the handoff cost from one unit to another, by unit name.
type Sync struct {
	From    string  `json:"from"`
	To      string  `json:"to"`
	Seconds float64 `json:"s"`
}

// Query is an op to predict.
type Query struct {
	Op      string
	DType   string
	M, K, N int
}

func (q Query) String() string {
	s := fmt.Sprintf("%s m=%d n=%d", q.Op, q.M, q.N)
	if q.K > 0 {
		s += fmt.Sprintf(" k=%d", q.K)
	}
	if q.DType != "" {
		s += " " + q.DType
	}
	return s
}

// Simulated reports whether the profile comes from an SoC description (its figures are
// predictions, never measurements).
func (p *Profile) Simulated() bool { return strings.HasPrefix(p.Source, "simulated") }

// UnitIndex is the index of the unit called name, or -1.
func (p *Profile) UnitIndex(name string) int {
	return slices.IndexFunc(p.Units, func(u Unit) bool { return u.Name == name })
}

// SyncCost is the handoff cost from unit a to unit b (0 for a == b).
func (p *Profile) SyncCost(a, b int) time.Duration {
	if a == b {
		return 0
	}
	for _, s := range p.Sync {
		if s.From == p.Units[a].Name && s.To == p.Units[b].Name {
			return seconds(s.Seconds)
		}
	}
	return seconds(p.DefaultSyncSeconds)
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// Slowdown is unit u's SharedSlowdown, at least 1.
func (p *Profile) Slowdown(u int) float64 { return max(p.Units[u].SharedSlowdown, 1) }

// Shared reports whether some unit runs slower while others run (SharedSlowdown above 1).
func (p *Profile) Shared() bool {
	return slices.ContainsFunc(p.Units, func(u Unit) bool { return u.SharedSlowdown > 1 })
}

// PadM is the row count unit u actually runs for m rows and how many runs: m itself on a
// unit without static shapes, else the smallest static size ≥ m, or runs of the largest.
func (u *Unit) PadM(m int) (size, runs int) {
	if len(u.StaticM) == 0 || m <= 0 {
		return m, 1
	}
	for _, s := range u.StaticM {
		if s >= m {
			return s, 1
		}
	}
	big := u.StaticM[len(u.StaticM)-1]
	return big, (m + big - 1) / big
}

// Time predicts how long unit u takes for q, from the unit's entries:
//
//   - M is padded to the unit's static sizes first (PadM); a time for M between two measured
//     row counts is interpolated linearly, beyond the largest extrapolated in proportion to M
//     (the compute-bound regime), below the smallest taken as the smallest's;
//   - entries of the same op and dtype with the query's K and N are used as they are; else the
//     group nearest in log K + log N (and in log M when M lies outside the group's row counts),
//     its time above LaunchSeconds scaled by K·N (a row-cut part of N, an attention over more
//     rows).
//
// An op class the unit refused wraps ErrRefused; one it has no entry for, ErrNoEntry.
func (p *Profile) Time(u int, q Query) (time.Duration, error) {
	if u < 0 || u >= len(p.Units) {
		return 0, fmt.Errorf("%w: unit %d of %d", ErrBadProfile, u, len(p.Units))
	}
	if q.M < 1 || q.N < 1 || q.K < 0 {
		return 0, fmt.Errorf("%w: query %v", ErrBadProfile, q)
	}
	un := &p.Units[u]
	m, runs := un.PadM(q.M)
	groups, err := p.groups(u, q.Op, q.DType)
	if err != nil {
		return 0, fmt.Errorf("%w: %s on %s: %s", ErrRefused, q, un.Name, err.Error())
	}
	if len(groups) == 0 {
		return 0, fmt.Errorf("%w: %s on %s", ErrNoEntry, q, un.Name)
	}
	// nearest in log K + log N, plus how far m lies outside the group's row counts (a group
	// timed at one row count says little about another: attention timed over as many keys as
	// queries has one point per K)
	dist := func(g *group) float64 {
		d := math.Abs(math.Log(float64(max(g.k, 1))/float64(max(q.K, 1)))) + math.Abs(math.Log(float64(g.n)/float64(q.N)))
		if lo, hi := g.pts[0].M, g.pts[len(g.pts)-1].M; m < lo {
			d += math.Log(float64(lo) / float64(m))
		} else if m > hi {
			d += math.Log(float64(m) / float64(hi))
		}
		return d
	}
	best := groups[0]
	// the group of the query's own K and N, where its row counts cover m (attention timed over
	// as many keys as queries has one row count per K: at fewer rows, a group of fewer keys
	// scaled up to K says more than that one point)
	if i := slices.IndexFunc(groups, func(g *group) bool {
		return g.k == q.K && g.n == q.N && g.pts[0].M <= m && m <= g.pts[len(g.pts)-1].M
	}); i >= 0 {
		best = groups[i]
	} else {
		for _, g := range groups[1:] {
			if dist(g) < dist(best) {
				best = g
			}
		}
	}
	t := interpM(best.pts, m, un.LaunchSeconds)
	if best.k != q.K || best.n != q.N {
		scale := float64(max(q.K, 1)) * float64(q.N) / (float64(max(best.k, 1)) * float64(best.n))
		t = un.LaunchSeconds + max(t-un.LaunchSeconds, 0)*scale
	}
	return seconds(t * float64(runs)), nil
}

// group is the entries of one (op, dtype, K, N) on a unit, sorted by M.
type group struct {
	k, n int
	pts  []Entry
}

type groupKey struct {
	unit      int
	op, dtype string
}

// index groups every unit's entries by (op, dtype) and then (K, N), once per profile (again
// when a unit's entry count changes). A refused op class maps to its reason.
type index struct {
	mu      sync.Mutex
	counts  []int
	groups  map[groupKey][]*group
	refused map[groupKey]string
}

func (p *Profile) groups(u int, op, dtype string) ([]*group, error) {
	p.idx.mu.Lock()
	defer p.idx.mu.Unlock()
	stale := len(p.idx.counts) != len(p.Units)
	for i := 0; !stale && i < len(p.Units); i++ {
		stale = p.idx.counts[i] != len(p.Units[i].Entries)
	}
	if stale {
		p.idx.counts = make([]int, len(p.Units))
		p.idx.groups = map[groupKey][]*group{}
		p.idx.refused = map[groupKey]string{}
		for ui, un := range p.Units {
			p.idx.counts[ui] = len(un.Entries)
			for _, e := range un.Entries {
				k := groupKey{ui, e.Op, strings.ToLower(e.DType)}
				if e.Refused != "" {
					p.idx.refused[k] = e.Refused
					continue
				}
				gs := p.idx.groups[k]
				i := slices.IndexFunc(gs, func(g *group) bool { return g.k == e.K && g.n == e.N })
				if i < 0 {
					gs = append(gs, &group{k: e.K, n: e.N})
					i = len(gs) - 1
				}
				gs[i].pts = append(gs[i].pts, e)
				p.idx.groups[k] = gs
			}
		}
		for _, gs := range p.idx.groups {
			for _, g := range gs {
				slices.SortFunc(g.pts, func(a, b Entry) int { return a.M - b.M })
			}
		}
	}
	k := groupKey{u, op, strings.ToLower(dtype)}
	if r, ok := p.idx.refused[k]; ok {
		return nil, errors.New(r)
	}
	return p.idx.groups[k], nil
}

// interpM interpolates sorted points at m (see Time).
func interpM(pts []Entry, m int, launch float64) float64 {
	if m <= pts[0].M {
		return pts[0].Seconds
	}
	for i := 1; i < len(pts); i++ {
		if m <= pts[i].M {
			a, b := pts[i-1], pts[i]
			f := float64(m-a.M) / float64(b.M-a.M)
			return a.Seconds + f*(b.Seconds-a.Seconds)
		}
	}
	last := pts[len(pts)-1]
	return launch + max(last.Seconds-launch, 0)*float64(m)/float64(last.M)
}

// Validate checks the profile's invariants: version, units with unique names and known
// kinds, entries with known ops, positive shapes and non-negative finite times, sorted static
// sizes, sync pairs naming units.
func (p *Profile) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrBadProfile}, a...)...) }
	if p.Version != Version {
		return bad("version %d (this build reads %d)", p.Version, Version)
	}
	if p.Source != "measured" && !strings.HasPrefix(p.Source, "simulated:") {
		return bad("source %q (measured or simulated:<soc>)", p.Source)
	}
	if len(p.Units) == 0 {
		return bad("no units")
	}
	fin := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
	if !fin(p.CombinedGBs) || !fin(p.DefaultSyncSeconds) {
		return bad("combined_gbs and default_sync_s must be finite and ≥ 0")
	}
	ops := []string{OpMatMul, OpAttention, OpAttentionHeads, OpNorm, OpRope, OpElementwise}
	for i, u := range p.Units {
		if u.Name == "" || p.UnitIndex(u.Name) != i {
			return bad("unit %d: empty or repeated name %q", i, u.Name)
		}
		if !slices.Contains([]string{"cpu", "gpu", "npu", "accel"}, u.Kind) {
			return bad("unit %s: kind %q (cpu, gpu, npu, accel)", u.Name, u.Kind)
		}
		if !fin(u.LaunchSeconds) || !fin(u.GBs) || u.RowAlign < 0 || !fin(u.SharedSlowdown) || u.SharedSlowdown > 1e3 ||
			!fin(u.Jitter) || u.Jitter > maxJitter {
			return bad("unit %s: launch_s, gbs, row_align, shared_slowdown, jitter must be finite and ≥ 0 (jitter at most %d)", u.Name, maxJitter)
		}
		if !slices.IsSorted(u.StaticM) || slices.ContainsFunc(u.StaticM, func(m int) bool { return m < 1 }) ||
			len(slices.Compact(slices.Clone(u.StaticM))) != len(u.StaticM) {
			return bad("unit %s: static_m must be increasing positive sizes", u.Name)
		}
		for _, e := range u.Entries {
			if !slices.Contains(ops, e.Op) {
				return bad("unit %s: op %q (one of %s)", u.Name, e.Op, strings.Join(ops, ", "))
			}
			if e.M < 1 || e.N < 1 || e.K < 0 || !fin(e.Seconds) || (e.Refused == "" && e.Seconds <= 0) {
				return bad("unit %s: entry %s m=%d k=%d n=%d s=%g", u.Name, e.Op, e.M, e.K, e.N, e.Seconds)
			}
			if e.DType != "" {
				if _, err := core.ParseDType(e.DType); err != nil {
					return bad("unit %s: entry dtype %q", u.Name, e.DType)
				}
			}
		}
	}
	for _, s := range p.Sync {
		if p.UnitIndex(s.From) < 0 || p.UnitIndex(s.To) < 0 || !fin(s.Seconds) {
			return bad("sync %s→%s: unknown unit or bad time", s.From, s.To)
		}
	}
	if err := p.Model.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadProfile, err)
	}
	return nil
}

// Parse reads a profile (unknown fields are errors) and validates it.
func Parse(b []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadProfile, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrBadProfile)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Marshal is the profile as indented JSON.
func (p *Profile) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	return append(b, '\n'), nil
}

// Key is the cache key of a profile: a hash of what its figures depend on (per unit: the
// name, i.e. device and context options, the plugin build and the device name; the model's
// shapes; the options of the measurement, e.g. the row grid).
func Key(units []Unit, m Model, options ...string) string {
	h := sha256.New()
	for _, u := range units {
		fmt.Fprintf(h, "unit=%s|%s|%s;", u.Name, u.Build, u.Device)
	}
	mb, _ := json.Marshal(m)
	h.Write(mb)
	for _, o := range options {
		fmt.Fprintf(h, ";%s", o)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// CacheDir is where profiles live: $XPU_CACHE_DIR/profiles, else $XDG_CACHE_HOME/xpu/profiles,
// else ~/.cache/xpu/profiles (the order of the other caches).
func CacheDir() (string, error) {
	d, err := cachedir.Dir("profiles")
	if err != nil {
		return "", fmt.Errorf("profile: %w", err)
	}
	return d, nil
}

// Save writes p to dir/<key>.json atomically and returns the path.
func Save(dir string, p *Profile) (string, error) {
	if p.Key == "" || strings.ContainsAny(p.Key, `/\.`) {
		return "", fmt.Errorf("%w: key %q", ErrBadProfile, p.Key)
	}
	b, err := p.Marshal()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("profile: save: %w", err)
	}
	path := filepath.Join(dir, p.Key+".json")
	tmp, err := os.CreateTemp(dir, ".profile-*")
	if err != nil {
		return "", fmt.Errorf("profile: save: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("profile: save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return "", fmt.Errorf("profile: save: %w", err)
	}
	return path, nil
}

// Load reads dir/<key>.json (ErrNoProfile when there is none).
func Load(dir, key string) (*Profile, string, error) {
	path := filepath.Join(dir, key+".json")
	b, err := safefile.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, path, fmt.Errorf("%w under key %s in %s (run xpu tune --profile)", ErrNoProfile, key, dir)
	}
	if err != nil {
		return nil, path, fmt.Errorf("profile: %w", err)
	}
	p, err := ParseFile(b, path)
	return p, path, err
}

// ParseFile is Parse with the file named in errors.
func ParseFile(b []byte, path string) (*Profile, error) {
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}
