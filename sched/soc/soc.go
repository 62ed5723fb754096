// Package soc describes phone SoCs for simulation: per unit (CPU, GPU, NPU) the matmul rate by
// precision, the memory bandwidth alone and all together, launch and sync costs and the
// static-shape rules, every figure with its source. Profile tabulates a description into a
// profile.Profile (Source "simulated:<soc>") over a model's shapes, so the solver and the DAG
// replay that serve real units serve a simulated phone too. Everything derived from a
// description is a prediction, never a measurement. The shipped description (sd8gen3) and
// the model of each op are documented in README.md next to this file.
package soc

import (
	"bytes"
	"embed"
	"encoding/json"

	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched/dag"
	"github.com/xpuhub/xpu/sched/profile"
	"github.com/xpuhub/xpu/sched/solve"
)

//go:embed socs/*.json
var socFiles embed.FS

// Sentinel errors.
var (
	// ErrUnknown is wrapped when a named description or model does not exist.
	ErrUnknown = fmt.Errorf("soc: unknown: %w", core.ErrNotFound)
	// ErrBad is wrapped by every error about a malformed description.
	ErrBad = fmt.Errorf("soc: malformed description: %w", core.ErrInvalidArgument)
	// ErrNoUnits is wrapped when a plan is asked of a description without units.
	ErrNoUnits = fmt.Errorf("soc: no units: %w", core.ErrInvalidArgument)
)

// SoC is a description.
type SoC struct {
	Name    string `json:"name"`
	Device  string `json:"device"`
	Version string `json:"version"`
	// DRAMGBs is the DRAM's peak; CombinedGBs what the units reach streaming together.
	DRAMGBs     float64 `json:"dram_gbs"`
	CombinedGBs float64 `json:"combined_gbs"`
	// DefaultSyncUS is the handoff between two units that Sync does not list.
	DefaultSyncUS float64           `json:"default_sync_us"`
	Sources       map[string]string `json:"sources"`
	Sync          []SyncDesc        `json:"sync"`
	// Units are the processors the solver plans for; a description of the CPU alone (for the
	// core search) has none.
	Units []Unit        `json:"units"`
	Paper []PaperFigure `json:"paper"`
	// CPU is the CPU's clusters and decode power model; nil where only units are described.
	CPU *CPU `json:"cpu,omitempty"`
}

// SyncDesc is the handoff cost from one unit to another.
type SyncDesc struct {
	From   string  `json:"from"`
	To     string  `json:"to"`
	US     float64 `json:"us"`
	Source string  `json:"source"`
}

// Unit is one processor of the description.
type Unit struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// TFLOPS is the matmul rate by precision ("f16", "int8") for large row counts.
	TFLOPS map[string]float64 `json:"tflops"`
	// FromCPU sets TFLOPS["int8"] and GBs from the description's CPU section (its performance
	// clusters' rate, the cores' bandwidth together), so the CPU's figures are stated once.
	FromCPU  bool    `json:"from_cpu,omitempty"`
	GBs      float64 `json:"gbs,omitempty"`
	LaunchUS float64 `json:"launch_us"`
	// MHalf: a matmul of m rows runs at m/(m+MHalf) of the rate (0: the full rate).
	MHalf int `json:"m_half"`
	// WideK: beyond K = WideK the rate falls as WideK/K, down to WideFloor (0: no effect).
	WideK     int     `json:"wide_k,omitempty"`
	WideFloor float64 `json:"wide_floor,omitempty"`
	// Tile pads K and N, and M above 1 (0: no padding); RowAlign is the row-cut granularity.
	Tile     int `json:"tile,omitempty"`
	RowAlign int `json:"row_align,omitempty"`
	// StaticM are the only row counts the unit runs (precompiled graphs); empty: any.
	StaticM []int `json:"static_m,omitempty"`
	// AttentionEff is attention's share of the f16 matmul rate.
	AttentionEff float64           `json:"attention_eff"`
	Sources      map[string]string `json:"sources"`
}

// PaperFigure is a published figure a prediction is compared with (never our result).
type PaperFigure struct {
	Model  string  `json:"model"`
	Metric string  `json:"metric"` // prefill_tok_s, decode_tok_s, bubble, ooo_latency_cut, tensor_over_layer
	Config string  `json:"config"`
	Value  float64 `json:"value"`
	High   float64 `json:"high,omitempty"`  // the top of a range, when the paper gives one
	Bound  string  `json:"bound,omitempty"` // "over": the paper says "over Value"
	Source string  `json:"source"`
	// Setup is the paper's configuration, as the solver replays it.
	Setup Setup `json:"setup"`
}

// Setup is how a paper's figure is reproduced: the units, the solver's mode, the dispatch
// policy, a fixed chunk length (0: the solver's choice), the prompt length (decode runs at that
// context).
type Setup struct {
	Units  []string `json:"units"`
	Mode   string   `json:"mode,omitempty"`   // single, layer, tensor
	Policy string   `json:"policy,omitempty"` // inorder, fifo, ooo (default ooo)
	Chunk  int      `json:"chunk,omitempty"`
	Prompt int      `json:"prompt"`
}

// Names lists the embedded descriptions.
func Names() []string {
	ents, _ := fs.ReadDir(socFiles, "socs")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(out)
	return out
}

// PlanNames lists the embedded descriptions that have units to plan for (the rest describe
// only a CPU, for the core search).
func PlanNames() []string {
	var out []string
	for _, n := range Names() {
		if s, err := Load(n); err == nil && len(s.Units) > 0 {
			out = append(out, n)
		}
	}
	return out
}

// Load reads an embedded description by name.
func Load(name string) (*SoC, error) {
	b, err := socFiles.ReadFile("socs/" + name + ".json")
	if err != nil {
		return nil, fmt.Errorf("%w: SoC %q (there are: %s)", ErrUnknown, name, strings.Join(Names(), ", "))
	}
	return Parse(b)
}

// Parse reads and checks a description: unknown fields are errors, every figure is finite and
// in range, and every figure has a source (a description without sources cannot be checked
// against the papers).
func Parse(b []byte) (*SoC, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s SoC
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBad, err)
	}
	if err := s.validate(); err != nil {
		return nil, err
	}
	for i := range s.Units {
		if u := &s.Units[i]; u.FromCPU {
			if u.TFLOPS == nil {
				u.TFLOPS = map[string]float64{}
			}
			u.TFLOPS["int8"] = s.CPU.Int8TOPS()
			u.GBs = s.CPU.GBs
		}
	}
	return &s, nil
}

func (s *SoC) validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w %q: "+f, append([]any{ErrBad, s.Name}, a...)...) }
	pos := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	nonneg := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }
	need := func(src map[string]string, keys ...string) error {
		for _, k := range keys {
			if strings.TrimSpace(src[k]) == "" {
				return bad("no source for %s", k)
			}
		}
		return nil
	}
	if s.Name == "" || (len(s.Units) == 0 && s.CPU == nil) {
		return bad("a name and units or a cpu section are required")
	}
	if s.CPU != nil {
		if err := s.CPU.validate(bad); err != nil {
			return err
		}
	}
	if len(s.Units) == 0 {
		return nil
	}
	if !pos(s.DRAMGBs) || !pos(s.CombinedGBs) || s.CombinedGBs > s.DRAMGBs || !nonneg(s.DefaultSyncUS) {
		return bad("dram_gbs and combined_gbs must be positive (combined ≤ dram), default_sync_us ≥ 0")
	}
	if err := need(s.Sources, "dram_gbs", "combined_gbs", "default_sync_us"); err != nil {
		return err
	}
	names := map[string]bool{}
	for _, u := range s.Units {
		if u.Name == "" || names[u.Name] {
			return bad("unit name %q empty or repeated", u.Name)
		}
		names[u.Name] = true
		if !slices.Contains([]string{"cpu", "gpu", "npu", "accel"}, u.Kind) {
			return bad("unit %s: kind %q", u.Name, u.Kind)
		}
		if !pos(u.TFLOPS["f16"]) && !u.FromCPU {
			return bad("unit %s: tflops.f16 must be positive", u.Name)
		}
		for p, v := range u.TFLOPS {
			if !pos(v) || (p != "f16" && p != "int8") {
				return bad("unit %s: tflops.%s = %v (f16 or int8, positive)", u.Name, p, v)
			}
			if err := need(u.Sources, "tflops."+p); err != nil {
				return err
			}
		}
		if u.FromCPU && (s.CPU == nil || u.GBs != 0 || u.TFLOPS["int8"] != 0) {
			return bad("unit %s: from_cpu needs a cpu section and takes gbs and tflops.int8 from it", u.Name)
		}
		if (!pos(u.GBs) && !u.FromCPU) || !nonneg(u.LaunchUS) || u.MHalf < 0 || u.WideK < 0 || !nonneg(u.WideFloor) || u.WideFloor > 1 ||
			u.Tile < 0 || u.RowAlign < 0 || !pos(u.AttentionEff) || u.AttentionEff > 1 {
			return bad("unit %s: gbs and attention_eff (≤ 1) must be positive, the rest ≥ 0", u.Name)
		}
		if !slices.IsSorted(u.StaticM) || slices.ContainsFunc(u.StaticM, func(m int) bool { return m < 1 }) {
			return bad("unit %s: static_m must be increasing positive sizes", u.Name)
		}
		keys := []string{"launch_us", "m_half", "attention_eff"}
		for k, set := range map[string]bool{"gbs": !u.FromCPU, "from_cpu": u.FromCPU, "wide_k": u.WideK > 0, "wide_floor": u.WideFloor > 0,
			"tile": u.Tile > 0, "row_align": u.RowAlign > 0, "static_m": len(u.StaticM) > 0} {
			if set {
				keys = append(keys, k)
			}
		}
		if err := need(u.Sources, keys...); err != nil {
			return fmt.Errorf("unit %s: %w", u.Name, err)
		}
	}
	for _, y := range s.Sync {
		if !names[y.From] || !names[y.To] || y.From == y.To || !nonneg(y.US) || strings.TrimSpace(y.Source) == "" {
			return bad("sync %s→%s: units, a time ≥ 0 and a source are required", y.From, y.To)
		}
	}
	for _, f := range s.Paper {
		if f.Model == "" || !slices.Contains(metrics, f.Metric) || !pos(f.Value) || f.Source == "" {
			return bad("paper figure %s/%s: model, a metric (%s), a positive value and a source are required", f.Model, f.Metric, strings.Join(metrics, ", "))
		}
		if len(f.Setup.Units) == 0 || f.Setup.Prompt < 1 || f.Setup.Chunk < 0 {
			return bad("paper figure %s/%s: the setup needs units and a prompt length", f.Model, f.Metric)
		}
		for _, u := range f.Setup.Units {
			if !names[u] {
				return bad("paper figure %s/%s: unit %q is not in the description", f.Model, f.Metric, u)
			}
		}
		if _, err := modeOf(f.Setup.Mode); err != nil {
			return bad("paper figure %s/%s: %v", f.Model, f.Metric, err)
		}
		if f.Setup.Policy != "" {
			if _, err := dag.PolicyByName(f.Setup.Policy); err != nil {
				return bad("paper figure %s/%s: %v", f.Model, f.Metric, err)
			}
		}
	}
	return nil
}

// metrics are the figures Compare can predict.
var metrics = []string{"prefill_tok_s", "decode_tok_s", "bubble", "ooo_latency_cut", "tensor_over_layer"}

func modeOf(s string) (solve.Mode, error) {
	switch s {
	case "", "tensor":
		return solve.Tensor, nil
	case "layer":
		return solve.Layer, nil
	case "single":
		return solve.Single, nil
	}
	return 0, fmt.Errorf("mode %q (single, layer, tensor)", s)
}

// Comparison is a published figure next to the description's prediction of it.
type Comparison struct {
	Figure PaperFigure
	// Predicted is in the figure's unit (tok/s, or a fraction for bubble and the relative
	// metrics); Ratio is Predicted/Figure.Value.
	Predicted, Ratio float64
}

// Compare predicts every published figure for model m from the description: it tabulates the
// profile, solves each figure's setup and reads the figure's metric off the replay.
func (s *SoC) Compare(m profile.Model) ([]Comparison, error) {
	prof, err := s.Profile(m)
	if err != nil {
		return nil, err
	}
	var out []Comparison
	for _, f := range s.Figures(m.Name) {
		st := f.Setup
		mode, _ := modeOf(st.Mode)
		o := solve.Options{Units: st.Units, Mode: mode, Prompt: st.Prompt}
		if st.Chunk > 0 {
			o.Chunks = []int{st.Chunk}
		}
		solveAt := func(mode solve.Mode, pol dag.Policy) (*solve.Plan, *dag.Result, error) {
			o := o
			o.Mode = mode
			pl, err := solve.Solve(prof, o)
			if err != nil {
				return nil, nil, err
			}
			res, err := solve.Replay(prof, pl, pol)
			return pl, res, err
		}
		pol := dag.OutOfOrder
		if st.Policy != "" {
			pol, _ = dag.PolicyByName(st.Policy)
		}
		var v float64
		switch f.Metric {
		case "prefill_tok_s":
			_, res, err := solveAt(mode, pol)
			if err != nil {
				return nil, err
			}
			v = float64(st.Prompt) / res.Makespan.Seconds()
		case "decode_tok_s":
			pl, _, err := solveAt(mode, pol)
			if err != nil {
				return nil, err
			}
			v = pl.Decode.TokPerSec
		case "bubble":
			_, res, err := solveAt(mode, pol)
			if err != nil {
				return nil, err
			}
			v = res.Bubble
		case "ooo_latency_cut":
			pl, ooo, err := solveAt(mode, dag.OutOfOrder)
			if err != nil {
				return nil, err
			}
			in, err := solve.Replay(prof, pl, dag.InOrder)
			if err != nil {
				return nil, err
			}
			v = 1 - ooo.Makespan.Seconds()/in.Makespan.Seconds()
		case "tensor_over_layer":
			_, lr, err := solveAt(solve.Layer, pol)
			if err != nil {
				return nil, err
			}
			_, tr, err := solveAt(solve.Tensor, pol)
			if err != nil {
				return nil, err
			}
			v = lr.Makespan.Seconds()/tr.Makespan.Seconds() - 1
		}
		out = append(out, Comparison{Figure: f, Predicted: v, Ratio: v / f.Value})
	}
	return out, nil
}

// unitIndex is the index of the unit called name, or -1.
func (s *SoC) unitIndex(name string) int {
	return slices.IndexFunc(s.Units, func(u Unit) bool { return u.Name == name })
}

// Precision is the arithmetic unit u runs a projection with weights of dtype in: int8 for
// 8-bit weights (mllm-NPU's W8A8) where the unit has an int8 rate, and on a CPU unit for any
// quantized weights (llama.cpp's kernels quantize activations to 8 bits); f16 otherwise
// (HeteroLLM's W4A16 computes in FP16).
func (u *Unit) Precision(dtype string) string {
	_, hasInt8 := u.TFLOPS["int8"]
	if !hasInt8 {
		return "f16"
	}
	d, err := core.ParseDType(dtype)
	if err == nil && (d == core.Q8_0 || (u.Kind == "cpu" && d.Quantized())) {
		return "int8"
	}
	if _, ok := u.TFLOPS["f16"]; !ok {
		return "int8"
	}
	return "f16"
}

// actBytes is the size of an activation element: FP16 on every unit.
const actBytes = 2

func roundUp(v, q int) int {
	if q <= 1 {
		return v
	}
	return (v + q - 1) / q * q
}

// Seconds is the modelled time of q on unit u (see README.md, "The op model"): a launch cost
// plus the larger of the compute time (padded shape over the rate, scaled by the row and
// width efficiencies) and the memory time (weights and activations over the unit's bandwidth).
func (u *Unit) Seconds(q profile.Query) float64 {
	m, k, n := q.M, q.K, q.N
	if u.Tile > 1 {
		if m > 1 {
			m = roundUp(m, u.Tile)
		}
		k, n = roundUp(k, u.Tile), roundUp(n, u.Tile)
	}
	effM := 1.0
	// one row is decode's GEMV: a graph of its own that streams the weights (HeteroLLM
	// §4.1.2 precompiles it; decode is memory-bound), not the matrix unit filling up
	if u.MHalf > 0 && m > 1 {
		effM = float64(m) / float64(m+u.MHalf)
	}
	launch := u.LaunchUS * 1e-6
	bw := u.GBs * 1e9
	switch q.Op {
	case profile.OpMatMul:
		rate := u.TFLOPS[u.Precision(q.DType)] * 1e12 * effM
		if u.WideK > 0 && k > u.WideK {
			rate *= max(float64(u.WideK)/float64(k), u.WideFloor)
		}
		compute := 2 * float64(m) * float64(k) * float64(n) / rate
		mem := (float64(profile.WeightBytes(q.DType, q.K, q.N)) + actBytes*float64(q.M)*float64(q.K+q.N)) / bw
		return launch + max(compute, mem)
	case profile.OpAttention:
		rate := u.TFLOPS["f16"]
		if rate == 0 {
			rate = u.TFLOPS["int8"] / 2
		}
		rate *= 1e12 * u.AttentionEff * effM
		compute := 4 * float64(m) * float64(k) * float64(n) / rate
		// K and V rows (as wide as the queries at most) and the queries and output
		mem := actBytes * (2*float64(q.K)*float64(q.N) + 2*float64(q.M)*float64(q.N)) / bw
		return launch + max(compute, mem)
	default: // one pass over [M, N] in and out (the norm reads twice)
		passes := 3.0
		if q.Op == profile.OpNorm {
			passes = 4
		}
		return launch + passes*actBytes*float64(q.M)*float64(q.N)/bw
	}
}

// Profile tabulates the description for model m: every unit's times for the model's ops over
// the row grid (and, for row-cut parts, over the N a part can have), its launch cost,
// bandwidth, static sizes and row alignment, the combined bandwidth and the sync costs. The
// result's Source is "simulated:<name>".
func (s *SoC) Profile(m profile.Model) (*profile.Profile, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if len(s.Units) == 0 {
		return nil, fmt.Errorf("%w: SoC %q describes only its CPU clusters (for xpu tune --energy --simulate), no units to plan for", ErrNoUnits, s.Name)
	}
	p := &profile.Profile{Version: profile.Version, Source: "simulated:" + s.Name, Model: m,
		CombinedGBs: s.CombinedGBs, DefaultSyncSeconds: s.DefaultSyncUS * 1e-6,
		Notes: []string{fmt.Sprintf("PREDICTED from the %s description (%s), version %s: not a measurement", s.Name, s.Device, s.Version)}}
	for _, y := range s.Sync {
		p.Sync = append(p.Sync, profile.Sync{From: y.From, To: y.To, Seconds: y.US * 1e-6})
	}
	grid := []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	kvs := []int{32, 256, 1024, 4096}
	for _, u := range s.Units {
		pu := profile.Unit{Name: u.Name, Kind: u.Kind, Device: s.Device, Build: "soc:" + s.Name + "@" + s.Version,
			LaunchSeconds: u.LaunchUS * 1e-6, GBs: u.GBs, StaticM: slices.Clone(u.StaticM), RowAlign: u.RowAlign}
		add := func(q profile.Query) {
			pu.Entries = append(pu.Entries, profile.Entry{Op: q.Op, DType: q.DType, M: q.M, K: q.K, N: q.N, Seconds: u.Seconds(q)})
		}
		for _, mm := range m.DistinctMatMuls() {
			for _, n := range partNs(mm.N, u.RowAlign) {
				for _, r := range grid {
					add(profile.Query{Op: profile.OpMatMul, DType: mm.DType, M: r, K: mm.K, N: n})
				}
			}
		}
		for _, kv := range kvs {
			for _, r := range grid {
				if r <= kv {
					add(profile.Query{Op: profile.OpAttention, M: r, K: kv, N: m.Heads * m.HeadDim})
				}
			}
		}
		for _, c := range []struct {
			op string
			n  int
		}{{profile.OpNorm, m.Dim}, {profile.OpRope, (m.Heads + m.KVHeads) * m.HeadDim}, {profile.OpElementwise, m.Dim}, {profile.OpElementwise, m.FFN}} {
			for _, r := range grid {
				add(profile.Query{Op: c.op, M: r, N: c.n})
			}
		}
		p.Units = append(p.Units, pu)
	}
	p.Key = profile.Key(p.Units, m, p.Source)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("soc: %w", err)
	}
	return p, nil
}

// partNs are the widths a row-cut part of an n-wide projection can have on a unit: multiples
// of the alignment (at most 64 of them, evenly spaced), and n itself.
func partNs(n, align int) []int {
	step := max(align, 1)
	if n/step > 64 {
		step = roundUp((n+63)/64, step)
	}
	var out []int
	for v := step; v < n; v += step {
		out = append(out, v)
	}
	return append(out, n)
}

// Model returns a shipped model config by name (see Models).
func Model(name string) (profile.Model, error) {
	for _, m := range models {
		if strings.EqualFold(m.Name, name) {
			return m, nil
		}
	}
	return profile.Model{}, fmt.Errorf("%w: model %q (there are: %s)", ErrUnknown, name, strings.Join(ModelNames(), ", "))
}

// ModelNames lists the shipped model configs.
func ModelNames() []string {
	out := make([]string, len(models))
	for i, m := range models {
		out[i] = m.Name
	}
	return out
}

// models are the papers' models, shapes only (from their published configs), with the weight
// type each paper ran: mllm-NPU quantizes Qwen1.5-1.8B to W8A8 (q8_0 stands for it), HeteroLLM
// runs Llama-8B as W4A16 (q4_0).
var models = []profile.Model{
	{Name: "qwen1.5-1.8b", Layers: 24, Dim: 2048, FFN: 5504, Heads: 16, KVHeads: 16, HeadDim: 128, Vocab: 151936, DType: "q8_0"},
	{Name: "llama-8b", Layers: 32, Dim: 4096, FFN: 14336, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 128256, DType: "q4_0"},
}

// Figures returns the description's published figures for model.
func (s *SoC) Figures(model string) []PaperFigure {
	var out []PaperFigure
	for _, f := range s.Paper {
		if strings.EqualFold(f.Model, model) {
			out = append(out, f)
		}
	}
	return out
}
