package sched

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// StagePlacement is where the nodes of one stage graph run (ResolvedPlan.PlaceStage), by node
// index, as a StageSpec takes them.
type StagePlacement struct {
	// Units and Fallback are each node's unit and its fallback unit (-1: none).
	Units, Fallback []int
	// Splits holds the NodeSplit of each node a rule splits, nil for the others; nil when no
	// node splits.
	Splits []*NodeSplit
	// Used are the plan units that run a node or a part of a split one.
	Used map[int]bool
}

// PlaceStage places every node of stage graph g in phase: a node whose ID fixed holds runs on
// that plan unit; the plan's rules place the others, at the layer layerOf gives each. units maps
// a plan unit to the unit the placement names (a runtime's index); it holds every plan unit.
func (rp *ResolvedPlan) PlaceStage(phase Phase, g *core.Graph, layerOf func(*core.Node) int, fixed map[int]int, units []int) (StagePlacement, error) {
	if len(units) != len(rp.Specs) {
		return StagePlacement{}, fmt.Errorf("sched: %d unit indices for a plan of %d units: %w", len(units), len(rp.Specs), core.ErrInvalidArgument)
	}
	p := StagePlacement{Units: make([]int, len(g.Nodes)), Fallback: make([]int, len(g.Nodes)), Used: map[int]bool{}}
	for i, n := range g.Nodes {
		if u, ok := fixed[n.ID]; ok {
			if u < 0 || u >= len(units) {
				return StagePlacement{}, fmt.Errorf("sched: node %s on unit %d of %d: %w", n.Name, u, len(units), core.ErrInvalidArgument)
			}
			p.Units[i], p.Fallback[i] = units[u], -1
			p.Used[u] = true
			continue
		}
		u, fb, sp, err := rp.PlaceSplit(phase, layerOf(n), n)
		if err != nil {
			return StagePlacement{}, err
		}
		if fb >= 0 {
			fb = units[fb]
		}
		p.Units[i], p.Fallback[i] = units[u], fb
		if sp == nil {
			p.Used[u] = true
			continue
		}
		if p.Splits == nil {
			p.Splits = make([]*NodeSplit, len(g.Nodes))
		}
		ns := &NodeSplit{Strategy: sp.Strategy, Ratio: sp.Ratio, Lengths: sp.Lengths, Merge: units[u], Steal: sp.Steal, Adapt: sp.Adapt}
		for _, su := range sp.Units {
			ns.Units = append(ns.Units, units[su])
			p.Used[su] = true
		}
		p.Splits[i] = ns
	}
	return p, nil
}
