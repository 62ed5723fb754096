// Package shard plans how a model's layers move between graphs and units: it runs decode steps
// cut into shards across units (the runner's stage hook for plans with decode shards, registered
// by importing the package), and plans the progressive switch from prefill-shaped graphs to
// verify-shaped ones.
package shard

import (
	"fmt"
	"time"

	"github.com/xpuhub/xpu/core"
)

// Block is one block of layers for progressive graph switching: its compute time per
// prefill chunk under the prefill-shaped graph (Prefill) and under the verify-shaped one run
// repeatedly over the chunk's sub-chunks (Verify), and the time to load its verify graph
// (Load). Figures come from profiling the unit (or a SoC description); the plan is simulated.
type Block struct {
	Prefill, Verify, Load time.Duration
}

// Load is one block's graph load in a switch plan.
type Load struct {
	Block      int
	Start, End time.Duration
}

// SwitchPlan is a simulated progressive-switch schedule and what the alternatives take.
type SwitchPlan struct {
	Loads []Load
	// PrefillEnd is when the last chunk's last block finishes; End when the last load does
	// (the verify graphs are all in place: decoding can start at max of the two).
	PrefillEnd, End time.Duration
	// Sync is prefill on the prefill graphs then every load; NaiveAsync loads each block once
	// its last chunk ran, one load at a time, alongside the other blocks' compute.
	Sync, NaiveAsync time.Duration
}

// PlanSwitch schedules CoordGen's progressive graph switching (§3.2, Eqs. 1–2) for a
// static-shape unit that cannot keep both graphs of a block resident: blocks are switched to
// their verify graph one at a time, in block order, during chunked prefill; a block's load
// starts at the first compute boundary from which the computations before that block's next
// one cover the load (the least consecutive blocks that hide it), so no load stalls the
// prefill while hiding is possible; a switched block computes its remaining chunks with the
// verify graph repeated over sub-chunks (repetition equivalence). Loads that cannot be hidden
// run after prefill. Computations run one at a time, loads one at a time, a block never
// computes while its graph loads. The result is a simulation: no graph is loaded.
func PlanSwitch(blocks []Block, chunks int) (SwitchPlan, error) {
	if len(blocks) == 0 || chunks < 1 {
		return SwitchPlan{}, fmt.Errorf("shard: switch plan of %d blocks and %d chunks: %w", len(blocks), chunks, core.ErrInvalidArgument)
	}
	for i, b := range blocks {
		if b.Prefill < 0 || b.Verify < 0 || b.Load < 0 {
			return SwitchPlan{}, fmt.Errorf("shard: switch plan: block %d has a negative time: %w", i, core.ErrInvalidArgument)
		}
	}
	N := len(blocks)
	items := N * chunks // compute stream: chunk-major
	switched := make([]bool, N)
	var p SwitchPlan
	var now, loadFree time.Duration
	next := 0 // the next block to switch
	loadEnd := make([]time.Duration, N)
	loading := -1
	// cost of item i if it started now with the graphs as they will be
	cost := func(i int) time.Duration {
		if switched[i%N] {
			return blocks[i%N].Verify
		}
		return blocks[i%N].Prefill
	}
	for i := 0; i < items; i++ {
		// a finished load switches its block
		if loading >= 0 && loadEnd[loading] <= now {
			switched[loading], loading = true, -1
		}
		if loading < 0 && next < N && loadFree <= now {
			// Eq. 1–2: the computations from here to block next's next one must cover its load
			var cover time.Duration
			hidden := true
			for j := i; j < items; j++ {
				if j%N == next {
					hidden = cover >= blocks[next].Load
					break
				}
				cover += cost(j)
				if cover >= blocks[next].Load {
					break
				}
			}
			if hidden {
				loading = next
				loadEnd[next] = now + blocks[next].Load
				p.Loads = append(p.Loads, Load{Block: next, Start: now, End: loadEnd[next]})
				loadFree = loadEnd[next]
				next++
			}
		}
		b := i % N
		if loading == b {
			now = max(now, loadEnd[b]) // cannot happen by construction; a stall if it did
			switched[b], loading = true, -1
		}
		now += cost(i)
	}
	p.PrefillEnd = now
	if loading >= 0 {
		switched[loading] = true
	}
	t := max(now, loadFree)
	for ; next < N; next++ {
		p.Loads = append(p.Loads, Load{Block: next, Start: t, End: t + blocks[next].Load})
		t += blocks[next].Load
	}
	p.End = t

	var compute, loads time.Duration
	for _, b := range blocks {
		compute += time.Duration(chunks) * b.Prefill
		loads += b.Load
	}
	p.Sync = compute + loads
	// naive async: block j's load may start once its chunk M-1 computed
	var lf time.Duration
	var c time.Duration
	for i := 0; i < items; i++ {
		c += blocks[i%N].Prefill
		if i/N == chunks-1 {
			start := max(lf, c)
			lf = start + blocks[i%N].Load
		}
	}
	p.NaiveAsync = max(c, lf)
	return p, nil
}
