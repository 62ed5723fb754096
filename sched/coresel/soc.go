package coresel

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/sched/cputopo"
	"github.com/xpuhub/xpu/sched/energy"
)

//go:embed socs/*.json
var socFiles embed.FS

// ErrUnknownSoC is wrapped when a named SoC description does not exist.
var ErrUnknownSoC = errors.New("aecs: unknown SoC description")

// SoC is an SoC description for simulation: its CPU clusters (as the topology reader would see
// them) and a speed and power model of batch-1 decoding. Every figure derived from it is a
// prediction. The fields and how their values were chosen are documented in README.md.
type SoC struct {
	Name     string `json:"name"`
	Device   string `json:"device"`
	Governor string `json:"governor"`
	// IdleScaling: the governor lowers the frequency of clusters whose cores sit idle (to
	// IdleFreqFrac of their maximum). False on Meizu 21 (walt), where the paper saw only 10 %.
	IdleScaling  bool    `json:"idle_scaling"`
	IdleFreqFrac float64 `json:"idle_freq_frac"`
	// BusyFreqFrac is the frequency, as a fraction of the maximum, of a cluster running decode
	// (memory stalls keep schedutil a little below the top).
	BusyFreqFrac float64      `json:"busy_freq_frac"`
	DRAMGBs      float64      `json:"dram_gbs"`       // bandwidth the CPUs reach together
	SatSharpness float64      `json:"sat_sharpness"`  // soft-min exponent of per-core vs DRAM bandwidth
	SyncMsThread float64      `json:"sync_ms_thread"` // per token, per core beyond the fastest (scaled, see Predict)
	StaticW      float64      `json:"static_w"`       // SoC + DRAM background while decoding
	DRAMJPerGB   float64      `json:"dram_j_per_gb"`  // energy of moving 1 GB from DRAM
	Clusters     []SoCCluster `json:"clusters"`
	Model        Workload     `json:"model"` // the decode workload the paper measured with
	Paper        PaperResult  `json:"paper"`
}

// SoCCluster is one cpufreq domain of the description.
type SoCCluster struct {
	Type       string  `json:"type"`
	Cores      int     `json:"cores"`
	MaxGHz     float64 `json:"max_ghz"`
	Capacity   int     `json:"capacity"`
	Efficiency bool    `json:"efficiency"`
	GopsPerGHz float64 `json:"gops_per_ghz"` // int8 GEMV throughput of one core per GHz
	CoreGBs    float64 `json:"core_gbs"`     // DRAM bandwidth one core pulls at its maximum frequency
	DynWGHz3   float64 `json:"dyn_w_ghz3"`   // busy core: DynWGHz3·f³ W (V scales with f)
	IdleW      float64 `json:"idle_w"`       // idle core at the maximum frequency; ·(f/fmax)²
}

// Workload is the per-token cost of decoding.
type Workload struct {
	Name          string  `json:"name"`
	GBPerToken    float64 `json:"gb_per_token"`
	GopsPerToken  float64 `json:"gops_per_token"`
	PrefillTokSec float64 `json:"-"`
}

// PaperResult is what MNN-AECS reports for the device (for comparison, never as our result).
type PaperResult struct {
	Selection    string  `json:"selection"`     // Table 7, as per-cluster counts of Clusters
	Words        string  `json:"words"`         // Table 7's text
	SavingVsMNN  float64 `json:"saving_vs_mnn"` // energy saving vs stock MNN (4 big cores)
	SavingSource string  `json:"saving_source"` // where the figure is from
	SpeedVsMNN   float64 `json:"speed_vs_mnn"`  // speed ratio −1
	TreeSize     int     `json:"tree_size"`     // 0 when the paper does not say
}

// SoCNames lists the embedded descriptions.
func SoCNames() []string {
	ents, _ := fs.ReadDir(socFiles, "socs")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(out)
	return out
}

// LoadSoC reads an embedded description by name ("sd8gen3", "kirin9000").
func LoadSoC(name string) (*SoC, error) {
	b, err := socFiles.ReadFile("socs/" + name + ".json")
	if err != nil {
		return nil, fmt.Errorf("%w %q (there are: %s)", ErrUnknownSoC, name, strings.Join(SoCNames(), ", "))
	}
	return ParseSoC(b)
}

// Bounds of a description: phones have 2-4 clusters of at most 8 cores.
const (
	maxClusters     = 16
	maxClusterCores = 64
)

// ParseSoC reads and checks a description.
func ParseSoC(b []byte) (*SoC, error) {
	var s SoC
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("aecs: SoC description: %w", err)
	}
	bad := func(f string, a ...any) (*SoC, error) {
		return nil, fmt.Errorf("aecs: SoC description %q: "+f, append([]any{s.Name}, a...)...)
	}
	if len(s.Clusters) == 0 || len(s.Clusters) > maxClusters {
		return bad("%d clusters (1..%d)", len(s.Clusters), maxClusters)
	}
	pos := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	for i, c := range s.Clusters {
		if c.Cores < 1 || c.Cores > maxClusterCores || !pos(c.MaxGHz) || c.Capacity < 1 || !pos(c.GopsPerGHz) || !pos(c.CoreGBs) || !pos(c.DynWGHz3) || c.IdleW < 0 {
			return bad("cluster %d (%s): cores (1..%d), max_ghz, capacity, gops_per_ghz, core_gbs, dyn_w_ghz3 must be positive", i, c.Type, maxClusterCores)
		}
	}
	if !pos(s.DRAMGBs) || !pos(s.SatSharpness) || s.SyncMsThread < 0 || s.StaticW < 0 || s.DRAMJPerGB < 0 ||
		!pos(s.BusyFreqFrac) || s.BusyFreqFrac > 1 || s.IdleFreqFrac < 0 || s.IdleFreqFrac > 1 ||
		!pos(s.Model.GBPerToken) || !pos(s.Model.GopsPerToken) {
		return bad("dram_gbs, sat_sharpness, busy_freq_frac and the model's costs must be positive; fractions ≤ 1")
	}
	return &s, nil
}

// Topology is the description's topology, as cputopo would read it from the device (biggest
// cluster first, CPU ids in the description's order).
func (s *SoC) Topology() (*cputopo.Topology, error) {
	cl := make([]cputopo.Cluster, len(s.Clusters))
	for i, c := range s.Clusters {
		cl[i] = cputopo.Cluster{CPUs: make([]int, c.Cores), MaxFreqKHz: int(math.Round(c.MaxGHz * 1e6)),
			Capacity: c.Capacity, Type: c.Type, Governor: s.Governor, Efficiency: c.Efficiency}
	}
	return cputopo.New(cl)
}

// clusterOf maps topology cluster index → description cluster, matched by (capacity, kHz).
func (s *SoC) clusterOf(t *cputopo.Topology) ([]SoCCluster, error) {
	out := make([]SoCCluster, len(t.Clusters))
	for i, tc := range t.Clusters {
		found := false
		for _, c := range s.Clusters {
			if c.Capacity == tc.Capacity && int(math.Round(c.MaxGHz*1e6)) == tc.MaxFreqKHz && c.Cores == tc.Size() {
				out[i], found = c, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("aecs: topology cluster %d (%s) is not in SoC %s", i, tc.Type, s.Name)
		}
	}
	return out, nil
}

// Predict is the model's decode speed (tokens/s) and power (W) for selection sel of t.
//
// Speed: t_token = GB/BW + Gops/Σ compute + sync, where BW is the soft minimum of the
// selected cores' summed bandwidth and DRAM's, and each busy core runs at BusyFreqFrac of its
// cluster's maximum, and sync charges SyncMsThread for every core but the fastest, scaled by
// how much slower than the fastest core it is (a slow core is the straggler at each of a
// token's few hundred barriers). Power: StaticW + DRAM energy per byte × bandwidth + Σ busy DynWGHz3·f³ +
// Σ idle IdleW·(f/fmax)², idle clusters at IdleFreqFrac·fmax when the governor scales them
// (IdleScaling), at the maximum otherwise. This is deliberately not the tuner's heuristic
// h(I) (f² for all cores, frequencies by capacity ratio): the tuner must cope with a model
// that is only roughly right, as it does on a phone.
func (s *SoC) Predict(t *cputopo.Topology, sel cputopo.Selection) (tokPerSec, watts float64, err error) {
	if err := sel.Validate(t); err != nil {
		return 0, 0, err
	}
	cls, err := s.clusterOf(t)
	if err != nil {
		return 0, 0, err
	}
	var bw, gops, busyW, idleW, sync float64
	ref := 0.0 // the fastest core's GEMV rate
	for _, c := range cls {
		ref = max(ref, c.GopsPerGHz*c.MaxGHz)
	}
	minRel := math.Inf(1)
	for i, c := range cls {
		k := sel[i]
		fBusy := c.MaxGHz * s.BusyFreqFrac
		fIdle := c.MaxGHz
		if s.IdleScaling && k == 0 {
			fIdle = c.MaxGHz * s.IdleFreqFrac
		}
		if k > 0 {
			fIdle = fBusy // idle cores of a busy cluster share its frequency
		}
		bw += float64(k) * c.CoreGBs * fBusy / c.MaxGHz
		gops += float64(k) * c.GopsPerGHz * fBusy
		busyW += float64(k) * c.DynWGHz3 * fBusy * fBusy * fBusy
		if k > 0 {
			rel := ref / (c.GopsPerGHz * c.MaxGHz)
			sync += float64(k) * rel
			minRel = min(minRel, rel)
		}
		r := fIdle / c.MaxGHz
		idleW += float64(c.Cores-k) * c.IdleW * r * r
	}
	p := s.SatSharpness
	eff := math.Pow(math.Pow(bw, -p)+math.Pow(s.DRAMGBs, -p), -1/p)
	sec := s.Model.GBPerToken/eff + s.Model.GopsPerToken/gops + s.SyncMsThread*1e-3*(sync-minRel)
	tps := 1 / sec
	watts = s.StaticW + busyW + idleW + s.DRAMJPerGB*s.Model.GBPerToken*tps
	return tps, watts, nil
}

// PowerMeter is a model-based meter for decoding on sel: the description's predicted power
// (per-cluster power at the modelled frequencies) times the window. It is for devices whose
// energy cannot be read; its readings are Modelled and its name says which SoC and selection.
func (s *SoC) PowerMeter(t *cputopo.Topology, sel cputopo.Selection) (*energy.Model, error) {
	_, w, err := s.Predict(t, sel)
	if err != nil {
		return nil, err
	}
	return energy.NewModel(fmt.Sprintf("soc %s, %s, %.2f W", s.Name, sel.Key(), w), func() float64 { return w }), nil
}
