package cputopo

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Selection is a core selection as per-cluster core counts, indexed like Topology.Clusters
// (biggest cluster first). Which cores of a cluster run is not part of the decision: CPUs takes
// the lowest-numbered online ones.
type Selection []int

// Cores is the number of selected cores.
func (s Selection) Cores() int {
	n := 0
	for _, k := range s {
		n += k
	}
	return n
}

// Key is a compact, comparable form: the counts joined by '+' ("1+2+0").
func (s Selection) Key() string {
	parts := make([]string, len(s))
	for i, k := range s {
		parts[i] = strconv.Itoa(k)
	}
	return strings.Join(parts, "+")
}

// ParseSelection reads Key's form back ("1+2+0"), checked against t.
func ParseSelection(t *Topology, key string) (Selection, error) {
	parts := strings.Split(key, "+")
	s := make(Selection, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not per-cluster counts like 1+2+0", ErrBadSelection, key)
		}
		s[i] = n
	}
	return s, s.Validate(t)
}

// Validate checks s against t: one count per cluster, each between 0 and the cluster's size,
// at least one core.
func (s Selection) Validate(t *Topology) error {
	if len(s) != len(t.Clusters) {
		return fmt.Errorf("%w: %d counts for %d clusters", ErrBadSelection, len(s), len(t.Clusters))
	}
	for i, k := range s {
		if k < 0 || k > t.Clusters[i].Size() {
			return fmt.Errorf("%w: %d cores of cluster %d, which has %d", ErrBadSelection, k, i, t.Clusters[i].Size())
		}
	}
	if s.Cores() == 0 {
		return fmt.Errorf("%w: no cores selected", ErrBadSelection)
	}
	return nil
}

// CPUs resolves s to CPU ids: the first s[i] online CPUs of cluster i, ascending overall.
func (s Selection) CPUs(t *Topology) ([]int, error) {
	if err := s.Validate(t); err != nil {
		return nil, err
	}
	var ids []int
	for i, k := range s {
		ids = append(ids, t.Clusters[i].CPUs[:k]...)
	}
	slices.Sort(ids)
	return ids, nil
}

// Describe names s in words: "2×Cortex-A77@2.54GHz", "1×Cortex-X4@3.30GHz + 1×Cortex-A720@2.96GHz".
func (s Selection) Describe(t *Topology) string {
	var parts []string
	for i, k := range s {
		if k == 0 || i >= len(t.Clusters) {
			continue
		}
		c := t.Clusters[i]
		name := c.Type
		if name == "" {
			name = "cpu"
		}
		if c.MaxFreqKHz > 0 {
			name += fmt.Sprintf("@%.2fGHz", float64(c.MaxFreqKHz)/1e6)
		}
		parts = append(parts, fmt.Sprintf("%d×%s", k, name))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " + ")
}

// SelectionOf maps a CPU set to its selection, after checking that every CPU is online in t
// (an absent or offline CPU is ErrBadSelection, naming it).
func SelectionOf(t *Topology, cpus []int) (Selection, error) {
	if len(cpus) == 0 {
		return nil, fmt.Errorf("%w: empty CPU set", ErrBadSelection)
	}
	where := map[int]int{}
	for _, c := range t.CPUs {
		where[c.ID] = c.Cluster
	}
	s := make(Selection, len(t.Clusters))
	for _, id := range cpus {
		ci, ok := where[id]
		if !ok {
			return nil, fmt.Errorf("%w: CPU %d is offline or absent (online: %s)", ErrBadSelection, id, FormatCPUList(t.Online))
		}
		s[ci]++
	}
	return s, s.Validate(t)
}

// PhaseOptions are the neon plugin options for per-phase core selection: Context opens the
// context (its thread pool must be as large as the larger phase; no CPU set at context level),
// Prefill and Decode are the graph_prepare options of each phase's executables, so switching
// phases is running the other executable: the pool re-pins its workers (one
// sched_setaffinity per worker), nothing is reallocated or repacked.
type PhaseOptions struct {
	Context map[string]string
	Prefill map[string]string
	Decode  map[string]string
}

// NeonOptions gives the neon plugin options that run on selection s: cpus= (the resolved CPU
// list) and threads= (one worker per selected core). They are valid both as context options
// and as prepare options.
func NeonOptions(t *Topology, s Selection) (map[string]string, error) {
	ids, err := s.CPUs(t)
	if err != nil {
		return nil, err
	}
	return map[string]string{"cpus": FormatCPUList(ids), "threads": strconv.Itoa(len(ids))}, nil
}

// NeonPhaseOptions gives the options for prefill on one selection and decode on another.
func NeonPhaseOptions(t *Topology, prefill, decode Selection) (PhaseOptions, error) {
	p, err := NeonOptions(t, prefill)
	if err != nil {
		return PhaseOptions{}, fmt.Errorf("prefill: %w", err)
	}
	d, err := NeonOptions(t, decode)
	if err != nil {
		return PhaseOptions{}, fmt.Errorf("decode: %w", err)
	}
	return PhaseOptions{
		Context: map[string]string{"threads": strconv.Itoa(max(prefill.Cores(), decode.Cores()))},
		Prefill: p,
		Decode:  maps.Clone(d),
	}, nil
}
