package coresel

import (
	"errors"
	"fmt"
	"math"

	"github.com/xpuhub/xpu/sched/cputopo"
	"github.com/xpuhub/xpu/sched/energy"
	"github.com/xpuhub/xpu/sched/soc"
)

// ErrUnknownSoC is wrapped when a named SoC description does not exist or describes no CPU.
var ErrUnknownSoC = errors.New("coresel: unknown SoC description")

// SoC is an SoC description for simulation: its CPU clusters (as the topology reader would see
// them) and a speed and power model of batch-1 decoding, the cpu section of a sched/soc
// description. Every figure derived from it is a prediction. How the model's values were chosen
// is documented in README.md.
type SoC struct {
	Name   string
	Device string
	soc.CPU
}

// SoCCluster is one cpufreq domain of the description.
type SoCCluster = soc.Cluster

// Workload is the per-token cost of decoding.
type Workload = soc.Workload

// PaperResult is what MNN-AECS reports for the device (for comparison, never as our result).
type PaperResult = soc.CorePaper

// SoCNames lists the sched/soc descriptions that describe a CPU.
func SoCNames() []string {
	var out []string
	for _, n := range soc.Names() {
		if s, err := soc.Load(n); err == nil && s.CPU != nil {
			out = append(out, n)
		}
	}
	return out
}

// LoadSoC reads a sched/soc description by name ("sd8gen3", "kirin9000").
func LoadSoC(name string) (*SoC, error) {
	s, err := soc.Load(name)
	if errors.Is(err, soc.ErrUnknown) {
		return nil, fmt.Errorf("%w: %w", ErrUnknownSoC, err)
	}
	if err != nil {
		return nil, err
	}
	return fromSoC(s)
}

// ParseSoC reads and checks a sched/soc description that has a cpu section.
func ParseSoC(b []byte) (*SoC, error) {
	s, err := soc.Parse(b)
	if err != nil {
		return nil, err
	}
	return fromSoC(s)
}

func fromSoC(s *soc.SoC) (*SoC, error) {
	if s.CPU == nil {
		return nil, fmt.Errorf("%w: %q has no cpu section (there are: %v)", ErrUnknownSoC, s.Name, SoCNames())
	}
	return &SoC{Name: s.Name, Device: s.Device, CPU: *s.CPU}, nil
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
			return nil, fmt.Errorf("coresel: topology cluster %d (%s) is not in SoC %s", i, tc.Type, s.Name)
		}
	}
	return out, nil
}

// Predict is the model's decode speed (tokens/s) and power (W) for selection sel of t.
//
// Speed: t_token = GB/BW + Gops/Σ compute + sync, where BW is the soft minimum of the
// selected cores' summed bandwidth and GBs (the CPU cores together), and each busy core runs at BusyFreqFrac of its
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
	eff := math.Pow(math.Pow(bw, -p)+math.Pow(s.GBs, -p), -1/p)
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
