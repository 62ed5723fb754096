package dag

import (
	"fmt"
	"strconv"
	"time"
)

// Part is one unit's share of a step: a whole operator group on one unit, or one side of a
// split operator.
type Part struct {
	Unit int
	Cost time.Duration
	// Name tells the parts of a split step apart ("npu", "gpu"); it may be empty.
	Name string
}

// Step is one subgraph of a chunk: its parts run in parallel (a split operator) and all of them
// finish before the chunk's next step starts.
type Step struct {
	Name  string
	Layer int
	Parts []Part
	// CrossChunk marks a step that reads what earlier chunks wrote (attention reads their K/V
	// rows): it also waits for every earlier chunk's previous step (mllm-NPU's Eq. 2).
	CrossChunk bool
}

// Chunked builds the prefill DAG of a chunked prompt (mllm-NPU's G(i, j)): for each chunk i,
// steps(i) gives the chunk's steps in order (the same number for every chunk); step j waits
// for step j−1 of the same chunk (Eq. 3) and, when CrossChunk, for step j−1 of every earlier
// chunk (Eq. 2). Tasks are added chunk by chunk, so InOrder runs chunks in order. Parts with
// zero cost are dropped (a split that gives a unit nothing).
func Chunked(units, chunks int, steps func(chunk int) []Step) (*DAG, error) {
	d, err := New(units)
	if err != nil {
		return nil, err
	}
	if chunks < 1 {
		return nil, fmt.Errorf("%w: %d chunks", ErrBadDAG, chunks)
	}
	var ends [][][]int // ends[i][j]: the task IDs of chunk i's step j
	nsteps := -1
	for i := range chunks {
		st := steps(i)
		if nsteps >= 0 && len(st) != nsteps {
			return nil, fmt.Errorf("%w: chunk %d has %d steps, chunk 0 has %d", ErrBadDAG, i, len(st), nsteps)
		}
		nsteps = len(st)
		ends = append(ends, make([][]int, len(st)))
		for j, s := range st {
			var deps []int
			if j > 0 {
				deps = append(deps, ends[i][j-1]...)
				if s.CrossChunk {
					for k := range i {
						deps = append(deps, ends[k][j-1]...)
					}
				}
			}
			nonzero := 0
			for _, p := range s.Parts {
				if p.Cost > 0 {
					nonzero++
				}
			}
			for _, p := range s.Parts {
				if p.Cost <= 0 && nonzero > 0 {
					continue
				}
				name := "c" + strconv.Itoa(i) + "/" + s.Name
				if p.Name != "" {
					name += "#" + p.Name
				}
				id, err := d.Add(Task{Name: name, Unit: p.Unit, Cost: p.Cost, Deps: deps, Chunk: i, Layer: s.Layer})
				if err != nil {
					return nil, err
				}
				ends[i][j] = append(ends[i][j], id)
			}
			if len(ends[i][j]) == 0 {
				return nil, fmt.Errorf("%w: chunk %d step %d (%s) has no parts", ErrBadDAG, i, j, s.Name)
			}
		}
	}
	return d, nil
}
