package soc

import (
	"math"
	"strings"
)

// CPU is the CPU side of a description: its cpufreq clusters as the kernel exposes them and a
// model of batch-1 decoding's speed and power on a selection of their cores, which
// sched/coresel simulates the energy-aware core search on. A unit with FromCPU takes its int8
// rate and bandwidth from here, so the CPU is described once.
type CPU struct {
	Governor string `json:"governor"`
	// IdleScaling: the governor lowers the frequency of clusters whose cores sit idle (to
	// IdleFreqFrac of their maximum).
	IdleScaling  bool    `json:"idle_scaling"`
	IdleFreqFrac float64 `json:"idle_freq_frac"`
	// BusyFreqFrac is the frequency, as a fraction of the maximum, of a cluster running decode
	// (memory stalls keep schedutil a little below the top).
	BusyFreqFrac float64 `json:"busy_freq_frac"`
	// GBs is the DRAM bandwidth the CPU cores reach together while decoding (below the SoC's
	// DRAMGBs: one unit alone does not saturate the memory system).
	GBs          float64           `json:"gbs"`
	SatSharpness float64           `json:"sat_sharpness"`  // soft-min exponent of per-core vs GBs
	SyncMsThread float64           `json:"sync_ms_thread"` // per token, per core beyond the fastest
	StaticW      float64           `json:"static_w"`       // SoC + DRAM background while decoding
	DRAMJPerGB   float64           `json:"dram_j_per_gb"`  // energy of moving 1 GB from DRAM
	Clusters     []Cluster         `json:"clusters"`
	Model        Workload          `json:"model"` // the decode workload the core-selection paper measured with
	Paper        CorePaper         `json:"paper"`
	Sources      map[string]string `json:"sources"`
}

// Cluster is one cpufreq domain of the CPU.
type Cluster struct {
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

// CorePaper is what MNN-AECS reports for the device (for comparison, never as our result).
type CorePaper struct {
	Selection    string  `json:"selection"`     // Table 7, as per-cluster counts of Clusters
	Words        string  `json:"words"`         // Table 7's text
	SavingVsMNN  float64 `json:"saving_vs_mnn"` // energy saving vs stock MNN (4 big cores)
	SavingSource string  `json:"saving_source"` // where the figure is from
	SpeedVsMNN   float64 `json:"speed_vs_mnn"`  // speed ratio −1
	TreeSize     int     `json:"tree_size"`     // 0 when the paper does not say
}

// Bounds of a CPU: phones have 2-4 clusters of at most 8 cores.
const (
	maxClusters     = 16
	maxClusterCores = 64
)

// Int8TOPS is the int8 GEMV rate of the performance clusters at the busy frequency: what a
// decode thread pool on the big cores reaches (the efficiency cores are left to the system).
func (c *CPU) Int8TOPS() float64 {
	var gops float64
	for _, cl := range c.Clusters {
		if !cl.Efficiency {
			gops += float64(cl.Cores) * cl.GopsPerGHz * cl.MaxGHz * c.BusyFreqFrac
		}
	}
	return gops / 1000
}

func (c *CPU) validate(bad func(string, ...any) error) error {
	if len(c.Clusters) == 0 || len(c.Clusters) > maxClusters {
		return bad("cpu: %d clusters (1..%d)", len(c.Clusters), maxClusters)
	}
	pos := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	for i, cl := range c.Clusters {
		if cl.Cores < 1 || cl.Cores > maxClusterCores || !pos(cl.MaxGHz) || cl.Capacity < 1 || !pos(cl.GopsPerGHz) ||
			!pos(cl.CoreGBs) || !pos(cl.DynWGHz3) || cl.IdleW < 0 || math.IsInf(cl.IdleW, 0) {
			return bad("cpu cluster %d (%s): cores (1..%d), max_ghz, capacity, gops_per_ghz, core_gbs, dyn_w_ghz3 must be positive", i, cl.Type, maxClusterCores)
		}
	}
	if !pos(c.GBs) || !pos(c.SatSharpness) || c.SyncMsThread < 0 || c.StaticW < 0 || c.DRAMJPerGB < 0 ||
		math.IsInf(c.SyncMsThread+c.StaticW+c.DRAMJPerGB, 0) ||
		!pos(c.BusyFreqFrac) || c.BusyFreqFrac > 1 || c.IdleFreqFrac < 0 || c.IdleFreqFrac > 1 ||
		!pos(c.Model.GBPerToken) || !pos(c.Model.GopsPerToken) {
		return bad("cpu: gbs, sat_sharpness, busy_freq_frac and the model's costs must be positive; fractions ≤ 1")
	}
	for _, k := range []string{"clusters", "gbs", "power"} {
		if strings.TrimSpace(c.Sources[k]) == "" {
			return bad("cpu: no source for %s", k)
		}
	}
	return nil
}
