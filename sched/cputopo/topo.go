// Package cputopo reads a Linux/Android CPU topology (clusters, capacities, maximum frequencies,
// core types, governors, online CPUs) from sysfs and /proc/cpuinfo, and names core selections as
// per-cluster core counts (MNN-AECS, ../shared/research/seed-000-aecs.md §2.1): cores inside one
// cluster are interchangeable, so the exhaustive space is ∏(|Cᵢ|+1) − 1 selections.
//
// Sources, all relative to a root ("/" by default, a fake tree in tests, WithRoot):
//
//	sys/devices/system/cpu/online                       online CPUs ("0-7")
//	sys/devices/system/cpu/cpuN/cpufreq/related_cpus    the frequency domain = the cluster
//	sys/devices/system/cpu/cpuN/cpufreq/cpuinfo_max_freq  kHz
//	sys/devices/system/cpu/cpuN/cpufreq/scaling_governor
//	sys/devices/system/cpu/cpuN/cpu_capacity            1024 = the biggest core
//	proc/cpuinfo                                        "CPU part" (Arm) or "model name" (x86)
//
// A machine without cpufreq (a VM such as this project's CI: 2 vCPUs, no cpufreq directory) is
// read as one cluster per distinct cpu_capacity (one cluster when they are equal, or absent),
// with the maximum frequency taken from /proc/cpuinfo's "cpu MHz" where present and the
// governor reported as "" (HasCPUFreq false): every selection of k cores is then equivalent and
// the space is |C| selections.
package cputopo

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrUnreadable is wrapped when the topology cannot be read (no online list, no CPUs).
var ErrUnreadable = errors.New("cputopo: topology unreadable")

// ErrBadSelection is wrapped by every error about a selection or CPU set that does not fit the
// topology (a count larger than its cluster, an offline or absent CPU, an empty selection).
var ErrBadSelection = errors.New("cputopo: bad core selection")

// CPU is one online logical CPU.
type CPU struct {
	ID         int
	Cluster    int    // index into Topology.Clusters
	Capacity   int    // cpu_capacity (0 when absent)
	MaxFreqKHz int    // cpuinfo_max_freq (or cpu MHz ×1000 without cpufreq; 0 when unknown)
	Part       string // "0xd0d" from "CPU part", "" on x86
	Type       string // "Cortex-A77", or the x86 model name
}

// Cluster is a set of interchangeable cores: one cpufreq domain.
type Cluster struct {
	CPUs       []int // online CPU ids, ascending
	MaxFreqKHz int
	Capacity   int // the largest cpu_capacity among the cluster's CPUs
	Type       string
	Governor   string // "" without cpufreq
	// Efficiency marks a cluster of efficiency cores (Cortex-A5x, A510/A520): the AECS search
	// leaves them out, as the paper's tuned results all do (seed-000 §2.5).
	Efficiency bool
}

// Size is the number of online cores in the cluster.
func (c Cluster) Size() int { return len(c.CPUs) }

// Topology is a machine's CPUs grouped into clusters, biggest first (by capacity, then maximum
// frequency, then lowest CPU id).
type Topology struct {
	Root       string
	Online     []int
	CPUs       []CPU // by ID
	Clusters   []Cluster
	HasCPUFreq bool
}

type config struct{ root string }

// Option configures Read.
type Option func(*config)

// WithRoot reads the tree under root instead of "/" (a fake sysfs/procfs tree in tests).
func WithRoot(root string) Option { return func(c *config) { c.root = root } }

// Read reads the topology of the machine (or of the tree WithRoot names).
func Read(opts ...Option) (*Topology, error) {
	cfg := config{root: "/"}
	for _, o := range opts {
		o(&cfg)
	}
	cpuDir := filepath.Join(cfg.root, "sys/devices/system/cpu")
	onlineText, err := os.ReadFile(filepath.Join(cpuDir, "online"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	online, err := ParseCPUList(strings.TrimSpace(string(onlineText)))
	if err != nil || len(online) == 0 {
		return nil, fmt.Errorf("%w: %s/online %q: %v", ErrUnreadable, cpuDir, strings.TrimSpace(string(onlineText)), err)
	}
	info := readCPUInfo(filepath.Join(cfg.root, "proc/cpuinfo"))
	t := &Topology{Root: cfg.root, Online: online}
	domain := map[int]string{} // cpu → cluster key
	govs := map[int]string{}
	for _, id := range online {
		c := CPU{ID: id, Cluster: -1}
		dir := filepath.Join(cpuDir, "cpu"+strconv.Itoa(id))
		c.Capacity, _ = readInt(filepath.Join(dir, "cpu_capacity"))
		if f, err := readInt(filepath.Join(dir, "cpufreq/cpuinfo_max_freq")); err == nil {
			t.HasCPUFreq = true
			c.MaxFreqKHz = f
			rel, err := os.ReadFile(filepath.Join(dir, "cpufreq/related_cpus"))
			key := "f" + strconv.Itoa(f) // without related_cpus: group by maximum frequency
			if err == nil {
				if l, err := ParseCPUList(strings.TrimSpace(string(rel))); err == nil && len(l) > 0 {
					key = "r" + strconv.Itoa(l[0])
				}
			}
			domain[id] = key
			if g, err := os.ReadFile(filepath.Join(dir, "cpufreq/scaling_governor")); err == nil {
				govs[id] = strings.TrimSpace(string(g))
			}
		} else {
			domain[id] = "c" + strconv.Itoa(c.Capacity)
		}
		if ci, ok := info[id]; ok {
			c.Part, c.Type = ci.part, ci.typ
			if c.MaxFreqKHz == 0 && !t.HasCPUFreq {
				c.MaxFreqKHz = ci.mhz * 1000
			}
		}
		t.CPUs = append(t.CPUs, c)
	}
	groups := map[string][]int{}
	var keys []string
	for i, c := range t.CPUs {
		k := domain[c.ID]
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], i)
	}
	for _, k := range keys {
		var cl Cluster
		for _, i := range groups[k] {
			c := t.CPUs[i]
			cl.CPUs = append(cl.CPUs, c.ID)
			cl.Capacity = max(cl.Capacity, c.Capacity)
			cl.MaxFreqKHz = max(cl.MaxFreqKHz, c.MaxFreqKHz)
			if cl.Type == "" {
				cl.Type = c.Type
			}
			if cl.Governor == "" {
				cl.Governor = govs[c.ID]
			}
		}
		cl.Efficiency = isEfficiencyPart(t.CPUs[groups[k][0]].Part)
		t.Clusters = append(t.Clusters, cl)
	}
	t.sortClusters()
	return t, nil
}

// New builds a topology from cluster descriptions (an SoC description for simulation): CPU ids
// are assigned from 0 in the given order of clusters; the result is sorted biggest first.
func New(clusters []Cluster) (*Topology, error) {
	t := &Topology{Root: "", HasCPUFreq: true}
	id := 0
	for _, c := range clusters {
		if len(c.CPUs) == 0 {
			return nil, fmt.Errorf("%w: cluster %q has no CPUs", ErrUnreadable, c.Type)
		}
		cl := c
		cl.CPUs = nil
		for range c.CPUs {
			cl.CPUs = append(cl.CPUs, id)
			t.Online = append(t.Online, id)
			t.CPUs = append(t.CPUs, CPU{ID: id, Capacity: c.Capacity, MaxFreqKHz: c.MaxFreqKHz, Type: c.Type})
			id++
		}
		t.Clusters = append(t.Clusters, cl)
	}
	t.sortClusters()
	return t, nil
}

func (t *Topology) sortClusters() {
	slices.SortStableFunc(t.Clusters, func(a, b Cluster) int {
		if a.Capacity != b.Capacity {
			return b.Capacity - a.Capacity
		}
		if a.MaxFreqKHz != b.MaxFreqKHz {
			return b.MaxFreqKHz - a.MaxFreqKHz
		}
		return a.CPUs[0] - b.CPUs[0]
	})
	idx := map[int]int{}
	for ci, cl := range t.Clusters {
		for _, id := range cl.CPUs {
			idx[id] = ci
		}
	}
	slices.SortFunc(t.CPUs, func(a, b CPU) int { return a.ID - b.ID })
	for i := range t.CPUs {
		t.CPUs[i].Cluster = idx[t.CPUs[i].ID]
	}
}

// MaxCapacity is the capacity of the biggest core (1024 on a well-formed tree; 0 when absent).
func (t *Topology) MaxCapacity() int {
	m := 0
	for _, c := range t.Clusters {
		m = max(m, c.Capacity)
	}
	return m
}

// Counts is the number of cores per cluster: the "all online cores" selection.
func (t *Topology) Counts() Selection {
	s := make(Selection, len(t.Clusters))
	for i, c := range t.Clusters {
		s[i] = c.Size()
	}
	return s
}

// SpaceSize is the number of non-empty selections, ∏(|Cᵢ|+1) − 1 (math.MaxInt when that
// does not fit an int).
func (t *Topology) SpaceSize() int {
	n := 1
	for _, c := range t.Clusters {
		if n > math.MaxInt/(c.Size()+1) {
			return math.MaxInt
		}
		n *= c.Size() + 1
	}
	return n - 1
}

// Exhaustive lists every non-empty selection (SpaceSize of them), in mixed-radix order.
func (t *Topology) Exhaustive() []Selection {
	var out []Selection
	cur := make(Selection, len(t.Clusters))
	var rec func(i int)
	rec = func(i int) {
		if i == len(cur) {
			if cur.Cores() > 0 {
				out = append(out, slices.Clone(cur))
			}
			return
		}
		for k := 0; k <= t.Clusters[i].Size(); k++ {
			cur[i] = k
			rec(i + 1)
		}
	}
	rec(0)
	return out
}

// String is a one-line summary: "1×Cortex-A77@3.13GHz + 3×Cortex-A77@2.54GHz + 4×Cortex-A55@2.05GHz".
func (t *Topology) String() string { return t.Counts().Describe(t) }

type cpuInfo struct {
	part, typ string
	mhz       int
}

// readCPUInfo reads per-processor core types; a missing file gives an empty map (types are
// informative only).
func readCPUInfo(path string) map[int]cpuInfo {
	out := map[int]cpuInfo{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	cur, ci := -1, cpuInfo{}
	flush := func() {
		if cur >= 0 {
			if ci.typ == "" && ci.part != "" {
				ci.typ = "Arm part " + ci.part
			}
			out[cur] = ci
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			if n, err := strconv.Atoi(v); err == nil {
				flush()
				cur, ci = n, cpuInfo{}
			}
		case "CPU part":
			ci.part = strings.ToLower(v)
			if name, ok := armParts[ci.part]; ok {
				ci.typ = name
			}
		case "model name":
			ci.typ = v
		case "cpu MHz":
			if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 {
				ci.mhz = int(f + 0.5)
			}
		}
	}
	flush()
	return out
}

// armParts names the Arm "CPU part" ids of the cores in the papers' devices (implementer 0x41).
var armParts = map[string]string{
	"0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd46": "Cortex-A510", "0xd80": "Cortex-A520",
	"0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76", "0xd0d": "Cortex-A77", "0xd41": "Cortex-A78",
	"0xd44": "Cortex-X1", "0xd47": "Cortex-A710", "0xd48": "Cortex-X2", "0xd4d": "Cortex-A715",
	"0xd4e": "Cortex-X3", "0xd81": "Cortex-A720", "0xd82": "Cortex-X4",
}

func isEfficiencyPart(part string) bool {
	switch part {
	case "0xd03", "0xd05", "0xd46", "0xd80":
		return true
	}
	return false
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%s: negative value %d", path, n)
	}
	return n, nil
}

// ParseCPUList reads a kernel CPU list ("0-3,5"), ascending and without duplicates.
func ParseCPUList(s string) ([]int, error) {
	var out []int
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: empty CPU list", ErrBadSelection)
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a > 4095 {
			return nil, fmt.Errorf("%w: CPU list %q: %q is not a CPU number", ErrBadSelection, s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b > 4095 {
				return nil, fmt.Errorf("%w: CPU list %q: bad range %q", ErrBadSelection, s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FormatCPUList writes ids as the neon plugin's cpus= option reads them ("2,3,4").
func FormatCPUList(ids []int) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(id)
	}
	return strings.Join(parts, ",")
}
