package sched

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/xpuhub/xpu/core"
)

// Report is a session's placement: on which execution unit every node runs, at what precision,
// what fell back and why, and the tensors each Run hands from one unit to another.
type Report struct {
	Policy     string
	Strict     bool
	Units      []string // names of the units that got at least one node (UnitName)
	Partitions int
	Nodes      []NodeReport
	// CopiesPerRun counts the tensors each Run hands from the unit that makes them to another
	// that reads them, CopyBytesPerRun their size. They pass through the runtime's arena: in
	// place for units that import it, copied by those that cannot (RuntimeReport counts those
	// copies).
	CopiesPerRun    int
	CopyBytesPerRun int64
	// Runs, Copies and CopyBytes are totals over the Runs completed so far.
	Runs      int64
	Copies    int64
	CopyBytes int64
}

// NodeReport is one node's placement.
type NodeReport struct {
	Node      string
	Op        core.Op
	Unit      string // the unit's name: "neon:0", "neon:0{cpus=1}"
	Partition int    // -1 when the node's result is never used (it does not run)
	Precision core.Precision
	CopiesIn  int // inputs handed over from another unit (at the first node of its partition to read them)
	Fallback  bool
	Reason    string // the refusals that moved it off its first choice
}

// Report describes the session's placement. It is safe to call while Runs are in flight.
func (s *Session) Report() Report {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := Report{Policy: s.policy.Name(), Strict: s.strict, Partitions: len(s.parts),
		CopiesPerRun: s.plan.copies, CopyBytesPerRun: s.plan.copyBytes,
		Runs: s.runs.Load(), Copies: s.copiesDone.Load(), CopyBytes: s.copyBytesDone.Load()}
	partOf := make([]int, len(s.assign))
	for i := range partOf {
		partOf[i] = -1
	}
	usedDev := make([]bool, len(s.devices))
	for _, p := range s.parts {
		usedDev[p.Device] = true
		for _, id := range p.Nodes {
			partOf[id] = p.Index
		}
	}
	for i, name := range s.names {
		if usedDev[i] {
			r.Units = append(r.Units, name)
		}
	}
	for i, a := range s.assign {
		nr := NodeReport{Node: a.Node.Name, Op: a.Node.Op, Unit: s.names[a.Device],
			Partition: partOf[i], Precision: a.Precision, Fallback: a.Fallback, Reason: a.Reason}
		if i < len(s.plan.copiesIn) {
			nr.CopiesIn = s.plan.copiesIn[i]
		}
		r.Nodes = append(r.Nodes, nr)
	}
	return r
}

// String prints a summary line and an aligned table, one row per node.
func (r Report) String() string {
	var b strings.Builder
	mode := ""
	if r.Strict {
		mode = ", strict"
	}
	fmt.Fprintf(&b, "policy %s%s; units %s; %d partition(s); %d copies per run (%d bytes)\n",
		r.Policy, mode, strings.Join(r.Units, " "), r.Partitions, r.CopiesPerRun, r.CopyBytesPerRun)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tOP\tUNIT\tPART\tPRECISION\tCOPIES\tFALLBACK")
	for _, n := range r.Nodes {
		part, fb := "-", ""
		if n.Partition >= 0 {
			part = fmt.Sprint(n.Partition)
		}
		if n.Fallback {
			fb = n.Reason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Node, n.Op, n.Unit, part, n.Precision, n.CopiesIn, fb)
	}
	tw.Flush()
	// an empty last column leaves the tabwriter's padding at the end of the line
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// copyPlan counts the tensors a run moves between units: a partition's input made by a
// partition on another unit, once per consuming unit.
type copyPlan struct {
	copies    int
	copyBytes int64
	copiesIn  []int // per node ID: inputs brought in from another unit
}

// planCopies counts the copies of parts (in partition order, which is topological).
func planCopies(g *core.Graph, parts []*Partition) copyPlan {
	plan := copyPlan{copiesIn: make([]int, len(g.Nodes))}
	type onUnit struct {
		t    *core.Tensor
		unit int
	}
	producer := map[*core.Tensor]int{} // tensor -> the unit of the partition that makes it
	copied := map[onUnit]bool{}
	for _, p := range parts {
		for _, t := range p.Inputs {
			from, made := producer[t]
			k := onUnit{t, p.Device}
			if t.Kind == core.KindInput || !made || from == p.Device || copied[k] {
				continue
			}
			copied[k] = true
			plan.copies++
			plan.copyBytes += t.Bytes()
			for _, id := range p.Nodes {
				if slices.Contains(g.Nodes[id].Inputs, t) {
					plan.copiesIn[id]++
					break
				}
			}
		}
		for _, t := range p.Outputs {
			producer[t] = p.Device
		}
	}
	return plan
}
