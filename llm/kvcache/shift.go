package kvcache

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/sched"
)

// ShifterSpec is what a Shifter rotates and where it runs.
type ShifterSpec struct {
	// Config is the model's.
	Config *arch.Config
	// ContextLength is the runner's context (it chooses LongRoPE's tables).
	ContextLength int
	// Rows is the block of rows one chunk rotates: the cache must have Rows-1 rows past the
	// context, so that a block starting inside the context stays inside the cache.
	Rows int64
	// K is the K cache's dtype and KCache every layer's K cache.
	K      core.DType
	KCache []sched.Span
	// Place gives the runtime unit of node n and its fallback (-1: none) as the plan places the
	// layer's decode nodes, sched.ErrNoRule where no rule does.
	Place func(n *core.Node) (unit, fallback int, err error)
}

// Shifter rotates cached K rows in place for a context shift: ShiftGraph compiled as one stage
// over every layer's K cache, a block of rows per chunk (each output element depends only on
// its own row's pair, read before it is written). Its shape does not depend on how many rows
// move, so one prepared program serves every shift.
type Shifter struct {
	rt            *sched.Runtime
	c             *arch.Config
	ctxLen        int
	prog          *sched.Program
	rows          int64
	pos, cos, sin sched.Span // the delta's positions or RoPE tables, one entry per row
}

// NewShifter prepares the rotation on rt. Its nodes go where s.Place puts them (the rope is
// named as the forward graphs' k_rope); a node no rule places goes with its layer's rope.
func NewShifter(ctx context.Context, rt *sched.Runtime, s ShifterSpec) (*Shifter, error) {
	c := s.Config
	if c == nil || len(s.KCache) != c.Layers || s.Rows < 1 || s.Place == nil {
		return nil, fmt.Errorf("kvcache: context shift of %d K caches, %d rows a block (a config and a placement needed): %w",
			len(s.KCache), s.Rows, core.ErrInvalidArgument)
	}
	g, err := ShiftGraph(c, s.Rows, s.K)
	if err != nil {
		return nil, err
	}
	a := rt.Arena()
	sh := &Shifter{rt: rt, c: c, ctxLen: s.ContextLength, rows: s.Rows}
	half := int64(c.RopeDims / 2)
	if c.RopeFreqFactors == nil {
		sh.pos, err = a.Alloc(4 * s.Rows)
	} else if sh.cos, err = a.Alloc(s.Rows * half * 4); err == nil {
		sh.sin, err = a.Alloc(s.Rows * half * 4)
	}
	if err != nil {
		return nil, fmt.Errorf("kvcache: context shift inputs: %w", err)
	}
	units, fallback := make([]int, len(g.Nodes)), make([]int, len(g.Nodes))
	ropeUnit := make([]int, c.Layers)
	for l := range ropeUnit {
		u, _, err := s.Place(&core.Node{Name: fmt.Sprintf("blk.%d.k_rope", l), Op: core.OpRoPE})
		if err != nil {
			return nil, fmt.Errorf("kvcache: context shift: %w", err)
		}
		ropeUnit[l] = u
	}
	for i, nd := range g.Nodes {
		u, fb, err := s.Place(nd)
		if errors.Is(err, sched.ErrNoRule) {
			var l int
			if _, err := fmt.Sscanf(nd.Name, "blk.%d.", &l); err != nil || l < 0 || l >= c.Layers {
				l = c.Layers - 1 // a node outside the layers goes with the last layer, as the head does
			}
			units[i], fallback[i] = ropeUnit[l], -1
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kvcache: context shift: %w", err)
		}
		units[i], fallback[i] = u, fb
	}
	kRow, _ := Types{K: s.K, V: s.K}.RowBytes(*c)
	st := sched.StageSpec{Name: "k shift", Graph: g, Units: units, Fallback: fallback}
	for _, t := range g.Inputs {
		switch t.Name {
		case "pos":
			st.IO = append(st.IO, sched.Binding{Span: sh.pos})
		case "rope_cos":
			st.IO = append(st.IO, sched.Binding{Span: sh.cos})
		case "rope_sin":
			st.IO = append(st.IO, sched.Binding{Span: sh.sin})
		default:
			var l int
			if _, err := fmt.Sscanf(t.Name, "blk.%d.k_cache", &l); err != nil || l < 0 || l >= c.Layers {
				return nil, fmt.Errorf("kvcache: no binding for shift input %q: %w", t.Name, core.ErrInternal)
			}
			st.IO = append(st.IO, sched.Binding{Span: s.KCache[l], Stride: kRow})
		}
	}
	for l := range c.Layers {
		st.IO = append(st.IO, sched.Binding{Span: s.KCache[l], Stride: kRow})
	}
	sh.prog, err = rt.Compile(ctx, sched.ProgramSpec{Name: fmt.Sprintf("context shift (%d rows)", s.Rows),
		Phase: sched.PhaseDecode, Lanes: 1, Stages: []sched.StageSpec{st}})
	if err != nil {
		return nil, fmt.Errorf("kvcache: context shift: %w", err)
	}
	return sh, nil
}

// Rotate rotates the K rows [from, from+count) of every layer by -n positions, in whole blocks:
// the last one may reach past the moved rows into rows no token holds (rotating them is
// harmless), never past the cache.
func (sh *Shifter) Rotate(ctx context.Context, from, count, n int) error {
	a := sh.rt.Arena()
	delta := make([]int32, sh.rows)
	for i := range delta {
		delta[i] = int32(-n)
	}
	if sh.c.RopeFreqFactors == nil {
		copy(a.Bytes(sh.pos), core.EncodeI32(delta))
	} else {
		// the moved rows carry the attention factor already: turn them, do not scale them again
		cos, sin := sh.c.RotationTables(delta, sh.ctxLen, 1)
		copy(a.Bytes(sh.cos), core.EncodeF32(cos))
		copy(a.Bytes(sh.sin), core.EncodeF32(sin))
	}
	var chunks []sched.Chunk
	for row := int64(from); row < int64(from+count); row += sh.rows {
		chunks = append(chunks, sched.Chunk{Row: row, Index: len(chunks)})
	}
	if err := sh.prog.Run(ctx, chunks); err != nil {
		return fmt.Errorf("kvcache: %s: %w", sh.prog.Name(), err)
	}
	return nil
}

// Close releases the rotation's program.
func (sh *Shifter) Close() error { return sh.prog.Close() }
