// Package coresel chooses the CPU cores decode runs on: the selection with the least energy
// whose speed is within ε of the fastest, by the MNN-AECS tuner
// (../shared/research/seed-000-aecs.md §2). It searches once per device, in two stages:
//
//  1. Stage 1, the fastest selection Ĩ: start from one core of the biggest cluster and add the
//     next-biggest performance core while that makes decode faster (by more than MinGain).
//     Efficiency clusters (Cortex-A5x/A510/A520) are never added.
//  2. Stage 2, the candidate tree rooted at Ĩ (Algorithm 1): level 1 applies a) remove the
//     smallest selected core, b) remove the two smallest, c) move one core from a bigger
//     selected cluster to a smaller selected one, d) replace a selected cluster by an
//     unselected smaller (non-efficiency) one; level 2 applies c) and d) to the level-1 nodes
//     that still hold two or more cores. Each candidate is measured; those slower than
//     (1−ε)·speed(Ĩ) are removed (the paper's printed inequality is inverted; §2.3), and the
//     winner minimises E_h = (1−α)·E + α·κ·h·t, h being the paper's power heuristic (Eq. 9)
//     and κ scaling h·t so that it equals E at Ĩ.
//
// Trials go through the Trial interface: the real one (decode N tokens on a core selection,
// cmd/xpu's tune) and SimTrial (an SoC description's speed and power model) share the search.
// A selection measured in Stage 1 is not measured again in Stage 2. Results are persisted per
// device fingerprint (Store).
package coresel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/sched/cputopo"
)

// Measurement is one trial's outcome.
type Measurement struct {
	TokPerSec      float64 `json:"tok_per_sec"`
	JoulesPerToken float64 `json:"joules_per_token"`
	Modelled       bool    `json:"modelled"` // the energy comes from a model, not a meter
	Meter          string  `json:"meter"`
	CPUSecPerToken float64 `json:"cpu_sec_per_token,omitempty"` // getrusage, where measured
	Tokens         int     `json:"tokens"`
	Note           string  `json:"note,omitempty"`
}

// Trial measures decode on one selection: warm-up, then a fixed number of tokens.
type Trial interface {
	Measure(ctx context.Context, sel cputopo.Selection) (Measurement, error)
}

// Config are the tuner's parameters (seed-000 §2.4: the paper publishes none of a, b, P_s, α).
type Config struct {
	Epsilon float64 // allowed slowdown vs Ĩ (0.08)
	Alpha   float64 // weight of the heuristic in E_h (0.5)
	// MinGain is the speed-up Stage 1 needs to keep adding cores (0.02: below it, noise).
	MinGain float64
	// IdleFactor is b, the cost of an unselected core relative to a selected one (0.1).
	IdleFactor float64
	// StaticFraction sets P_s as a fraction of h with every core busy at its maximum (0.1).
	StaticFraction float64
	// ClusterFactors are a_i; nil derives them from capacity per GHz, relative to the biggest.
	ClusterFactors []float64
	// FlatGovernor turns the heuristic's governor model off (s_I = 1: every cluster at its
	// maximum), for devices whose governor does not lower idle clusters (Meizu 21's walt, per
	// the paper); the simulation sets it from the SoC description's idle_scaling.
	FlatGovernor bool
	// IncludeEfficiency lets Stage 1 and transformation d) use efficiency clusters.
	IncludeEfficiency bool
	// Progress hears every trial as it ends (nil: silence).
	Progress func(Event)
}

// DefaultConfig is the configuration Tune starts from.
func DefaultConfig() Config {
	return Config{Epsilon: 0.08, Alpha: 0.5, MinGain: 0.02, IdleFactor: 0.1, StaticFraction: 0.1}
}

// Option changes the configuration.
type Option func(*Config)

// WithConfig replaces the whole configuration.
func WithConfig(c Config) Option { return func(d *Config) { *d = c } }

// WithEpsilon sets ε.
func WithEpsilon(e float64) Option { return func(c *Config) { c.Epsilon = e } }

// WithAlpha sets α (0: measured energy only, the paper's ablation).
func WithAlpha(a float64) Option { return func(c *Config) { c.Alpha = a } }

// WithFlatGovernor sets Config.FlatGovernor.
func WithFlatGovernor(on bool) Option { return func(c *Config) { c.FlatGovernor = on } }

// WithProgress sets the progress callback.
func WithProgress(f func(Event)) Option { return func(c *Config) { c.Progress = f } }

// Event is one finished trial, for progress output.
type Event struct {
	Stage     string // "stage1", "stage2", "exhaustive"
	Index     int    // trials so far, this one included
	Selection cputopo.Selection
	Words     string
	M         Measurement
	Reused    bool // Stage 2 node already measured in Stage 1
}

// Node is one measured selection.
type Node struct {
	Selection cputopo.Selection `json:"-"`
	Key       string            `json:"selection"`
	Words     string            `json:"words"`
	Level     int               `json:"level"`               // 0 = Ĩ
	Transform string            `json:"transform,omitempty"` // a, b, c, d (from Parent)
	Parent    string            `json:"parent,omitempty"`
	M         Measurement       `json:"measurement"`
	H         float64           `json:"h"`  // heuristic power, arbitrary units
	EH        float64           `json:"eh"` // E_h, J/token
	Kept      bool              `json:"kept"`
}

// Result is a finished search.
type Result struct {
	Stage1   []Node            `json:"stage1"`
	Fastest  cputopo.Selection `json:"-"`
	Tree     []Node            `json:"tree"`
	Decode   cputopo.Selection `json:"-"`
	Prefill  cputopo.Selection `json:"-"`
	Best     Node              `json:"best"`
	Trials   int               `json:"trials"`
	Space    int               `json:"space"` // exhaustive space size
	Epsilon  float64           `json:"epsilon"`
	Alpha    float64           `json:"alpha"`
	Modelled bool              `json:"modelled"` // any energy figure came from a model
}

// ErrNoCandidate: every candidate failed its trial or the ε filter removed them all (the
// root cannot be removed, so this means trials failed).
var ErrNoCandidate = errors.New("coresel: no candidate survived")

type tuner struct {
	cfg    Config
	top    *cputopo.Topology
	trial  Trial
	memo   map[string]Measurement
	trials int
}

func newTuner(top *cputopo.Topology, trial Trial, opts []Option) (*tuner, error) {
	cfg := DefaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if top == nil || len(top.Clusters) == 0 || trial == nil {
		return nil, fmt.Errorf("coresel: a topology with clusters and a trial are required: %w", cputopo.ErrBadSelection)
	}
	if cfg.Epsilon < 0 || cfg.Epsilon >= 1 || cfg.Alpha < 0 || cfg.Alpha > 1 || cfg.IdleFactor < 0 || cfg.IdleFactor > 1 ||
		cfg.MinGain < 0 || cfg.StaticFraction < 0 {
		return nil, fmt.Errorf("coresel: ε and b in [0,1), α in [0,1], MinGain and StaticFraction ≥ 0 (got ε %g α %g b %g)",
			cfg.Epsilon, cfg.Alpha, cfg.IdleFactor)
	}
	if cfg.ClusterFactors != nil && len(cfg.ClusterFactors) != len(top.Clusters) {
		return nil, fmt.Errorf("coresel: %d cluster factors for %d clusters", len(cfg.ClusterFactors), len(top.Clusters))
	}
	return &tuner{cfg: cfg, top: top, trial: trial, memo: map[string]Measurement{}}, nil
}

func (t *tuner) measure(ctx context.Context, stage string, sel cputopo.Selection) (Measurement, error) {
	if m, ok := t.memo[sel.Key()]; ok {
		if t.cfg.Progress != nil {
			t.cfg.Progress(Event{Stage: stage, Index: t.trials, Selection: sel, Words: sel.Describe(t.top), M: m, Reused: true})
		}
		return m, nil
	}
	if err := ctx.Err(); err != nil {
		return Measurement{}, err
	}
	m, err := t.trial.Measure(ctx, sel)
	if err != nil {
		return m, fmt.Errorf("coresel: trial %s (%s): %w", sel.Key(), sel.Describe(t.top), err)
	}
	if !(m.TokPerSec > 0) || math.IsInf(m.TokPerSec, 0) || m.JoulesPerToken < 0 || math.IsNaN(m.JoulesPerToken) {
		return m, fmt.Errorf("coresel: trial %s: nonsense measurement (%g tok/s, %g J/token)", sel.Key(), m.TokPerSec, m.JoulesPerToken)
	}
	t.trials++
	t.memo[sel.Key()] = m
	if t.cfg.Progress != nil {
		t.cfg.Progress(Event{Stage: stage, Index: t.trials, Selection: sel, Words: sel.Describe(t.top), M: m})
	}
	return m, nil
}

func (t *tuner) usable(i int) bool { return t.cfg.IncludeEfficiency || !t.top.Clusters[i].Efficiency }

// perfOrder lists the clusters Stage 1 may use, biggest first; when every cluster is an
// efficiency cluster, all of them.
func (t *tuner) perfOrder() []int {
	var out []int
	for i := range t.top.Clusters {
		if t.usable(i) {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		for i := range t.top.Clusters {
			out = append(out, i)
		}
	}
	return out
}

// Tune runs Stage 1 and Stage 2 and returns the decode selection (and the prefill selection:
// every core of the performance clusters, as prefill is compute-bound).
func Tune(ctx context.Context, top *cputopo.Topology, trial Trial, opts ...Option) (*Result, error) {
	t, err := newTuner(top, trial, opts)
	if err != nil {
		return nil, err
	}
	res := &Result{Space: top.SpaceSize(), Epsilon: t.cfg.Epsilon, Alpha: t.cfg.Alpha}

	// Stage 1
	order := t.perfOrder()
	cur := make(cputopo.Selection, len(top.Clusters))
	cur[order[0]] = 1
	curM, err := t.measure(ctx, "stage1", cur)
	if err != nil {
		return nil, err
	}
	res.Stage1 = append(res.Stage1, t.node(cur, curM, 0, "", ""))
	for {
		next := slices.Clone(cur)
		added := false
		for _, ci := range order {
			if next[ci] < top.Clusters[ci].Size() {
				next[ci]++
				added = true
				break
			}
		}
		if !added {
			break
		}
		m, err := t.measure(ctx, "stage1", next)
		if err != nil {
			return nil, err
		}
		res.Stage1 = append(res.Stage1, t.node(next, m, 0, "", ""))
		if m.TokPerSec <= curM.TokPerSec*(1+t.cfg.MinGain) {
			break
		}
		cur, curM = next, m
	}
	res.Fastest = cur

	// Stage 2
	cands := t.tree(cur)
	root := t.node(cur, curM, 0, "", "")
	nodes := []Node{root}
	for _, c := range cands {
		m, err := t.measure(ctx, "stage2", c.sel)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, t.node(c.sel, m, c.level, c.transform, c.parent.Key()))
	}
	t.score(nodes, root)
	res.Tree = nodes
	best := -1
	for i, n := range nodes {
		res.Modelled = res.Modelled || n.M.Modelled
		if n.Kept && (best < 0 || n.EH < nodes[best].EH) {
			best = i
		}
	}
	if best < 0 {
		return nil, ErrNoCandidate
	}
	res.Best, res.Decode, res.Trials = nodes[best], nodes[best].Selection, t.trials
	res.Prefill = make(cputopo.Selection, len(top.Clusters))
	for _, ci := range order {
		res.Prefill[ci] = top.Clusters[ci].Size()
	}
	return res, nil
}

// Exhaustive measures every selection and returns the least-energy one (measured E, α = 0)
// within ε of the fastest of all: the paper's reference for AECS's optimality.
func Exhaustive(ctx context.Context, top *cputopo.Topology, trial Trial, opts ...Option) (Node, []Node, error) {
	t, err := newTuner(top, trial, opts)
	if err != nil {
		return Node{}, nil, err
	}
	var nodes []Node
	fastest := 0.0
	for _, s := range top.Exhaustive() {
		m, err := t.measure(ctx, "exhaustive", s)
		if err != nil {
			return Node{}, nil, err
		}
		nodes = append(nodes, t.node(s, m, 0, "", ""))
		fastest = max(fastest, m.TokPerSec)
	}
	best := -1
	for i, n := range nodes {
		if n.M.TokPerSec >= fastest*(1-t.cfg.Epsilon) && (best < 0 || n.M.JoulesPerToken < nodes[best].M.JoulesPerToken) {
			best = i
		}
	}
	return nodes[best], nodes, nil
}

func (t *tuner) node(s cputopo.Selection, m Measurement, level int, tr, parent string) Node {
	return Node{Selection: slices.Clone(s), Key: s.Key(), Words: s.Describe(t.top), Level: level,
		Transform: tr, Parent: parent, M: m, H: t.heuristic(s)}
}

// score applies the ε filter against the root and computes E_h.
func (t *tuner) score(nodes []Node, root Node) {
	kappa := 0.0
	if ht := root.H / root.M.TokPerSec; ht > 0 {
		kappa = root.M.JoulesPerToken / ht
	}
	for i := range nodes {
		n := &nodes[i]
		n.Kept = n.M.TokPerSec >= root.M.TokPerSec*(1-t.cfg.Epsilon)
		n.EH = (1-t.cfg.Alpha)*n.M.JoulesPerToken + t.cfg.Alpha*kappa*n.H/n.M.TokPerSec
	}
}

// heuristic is Eq. 9: Σ a_i (|I_i| + (|C_i|−|I_i|)·b)(f_max,i·s_I)² + P_s, f in GHz.
func (t *tuner) heuristic(s cputopo.Selection) float64 {
	cl := t.top.Clusters
	maxCap, selCap := t.top.MaxCapacity(), 0
	for i, k := range s {
		if k > 0 {
			selCap = max(selCap, cl[i].Capacity)
		}
	}
	sI := 1.0
	if maxCap > 0 && selCap > 0 && !t.cfg.FlatGovernor {
		sI = float64(selCap) / float64(maxCap)
	}
	a := t.factors()
	var h, full float64
	for i, c := range cl {
		f := ghz(c)
		k := float64(s[i])
		h += a[i] * (k + (float64(c.Size())-k)*t.cfg.IdleFactor) * (f * sI) * (f * sI)
		full += a[i] * float64(c.Size()) * f * f
	}
	return h + t.cfg.StaticFraction*full
}

func ghz(c cputopo.Cluster) float64 {
	if c.MaxFreqKHz <= 0 {
		return 1
	}
	return float64(c.MaxFreqKHz) / 1e6
}

// factors are a_i: given, or capacity per GHz relative to the biggest cluster's (a core that
// does more per cycle is bigger and burns more per cycle).
func (t *tuner) factors() []float64 {
	if t.cfg.ClusterFactors != nil {
		return t.cfg.ClusterFactors
	}
	cl := t.top.Clusters
	out := make([]float64, len(cl))
	ref := 0.0
	for i, c := range cl {
		out[i] = 1
		if c.Capacity > 0 {
			out[i] = float64(c.Capacity) / ghz(c)
		}
		ref = max(ref, out[i])
	}
	for i := range out {
		out[i] /= ref
	}
	return out
}

type cand struct {
	sel       cputopo.Selection
	parent    cputopo.Selection
	level     int
	transform string
}

// tree lists Stage 2's candidates below root (root excluded), without duplicates or empties.
func (t *tuner) tree(root cputopo.Selection) []cand {
	seen := map[string]bool{root.Key(): true}
	var out []cand
	add := func(s, parent cputopo.Selection, level int, tr string) {
		if s == nil || s.Cores() == 0 || seen[s.Key()] {
			return
		}
		seen[s.Key()] = true
		out = append(out, cand{sel: s, parent: parent, level: level, transform: tr})
	}
	add(t.removeSmallest(root, 1), root, 1, "a")
	add(t.removeSmallest(root, 2), root, 1, "b")
	for _, s := range t.moves(root) {
		add(s, root, 1, "c")
	}
	for _, s := range t.replaces(root) {
		add(s, root, 1, "d")
	}
	level1 := slices.Clone(out)
	for _, p := range level1 {
		if p.sel.Cores() < 2 {
			continue
		}
		for _, s := range t.moves(p.sel) {
			add(s, p.sel, 2, "c")
		}
		for _, s := range t.replaces(p.sel) {
			add(s, p.sel, 2, "d")
		}
	}
	return out
}

// removeSmallest drops n cores from the smallest selected clusters (nil when fewer remain than
// one core).
func (t *tuner) removeSmallest(s cputopo.Selection, n int) cputopo.Selection {
	out := slices.Clone(s)
	for i := len(out) - 1; i >= 0 && n > 0; i-- {
		d := min(out[i], n)
		out[i] -= d
		n -= d
	}
	if n > 0 || out.Cores() == 0 {
		return nil
	}
	return out
}

// moves are transformation c): one core from a bigger selected cluster to a smaller selected
// cluster with room.
func (t *tuner) moves(s cputopo.Selection) []cputopo.Selection {
	var out []cputopo.Selection
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[i] > 0 && s[j] > 0 && s[j] < t.top.Clusters[j].Size() {
				n := slices.Clone(s)
				n[i]--
				n[j]++
				out = append(out, n)
			}
		}
	}
	return out
}

// replaces are transformation d): a selected cluster's cores moved to an unselected, smaller,
// usable cluster (as many as fit).
func (t *tuner) replaces(s cputopo.Selection) []cputopo.Selection {
	var out []cputopo.Selection
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[i] > 0 && s[j] == 0 && t.usable(j) {
				n := slices.Clone(s)
				n[j] = min(s[i], t.top.Clusters[j].Size())
				n[i] = 0
				out = append(out, n)
			}
		}
	}
	return out
}
