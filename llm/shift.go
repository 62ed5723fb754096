package llm

import (
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
)

// Context shift, as llama.cpp does it: when the cache is full, the first keep tokens stay,
// half of the rest is discarded, and the rows after the discarded ones move down into their
// place. A cached K row holds its token's key rotated by its position p; at its new row it
// must be rotated by p-n, and since RoPE's rotation is linear in the position, rotating the
// cached row by -n gives exactly that (up to rounding). V rows need no change. The rotation
// is a small graph over every layer's K rows: ROPE with delta positions, or for models with
// per-frequency factors the cos/sin tables of the delta; a quantized K is dequantized,
// rotated and quantized again (one more rounding, as llama.cpp's shift of a quantized cache).
//
// The shifted cache is not what a fresh prefill of the kept tokens would give (the moved
// tokens' keys and values of layers past the first were computed with the discarded tokens in
// view); that is the point: the model goes on with what it had read, at the cost of a
// recompute it skips.

// ErrNoShift: a context shift with these keep and discard counts would discard nothing.
var ErrNoShift = errors.New("llm: the context cannot be shifted")

// shiftProg rotates K rows in place, a block of rows per run (one chunk per block): its
// shape does not depend on how many rows move, so one prepared program serves every shift.
type shiftProg struct {
	prog          *sched.Program
	rows          int64      // rows per block
	pos, cos, sin sched.Span // the delta's positions or RoPE tables, one entry per row
}

// WithContextShift lets Generate go on past a full context as llama.cpp does (its --keep and
// llama-server's n_keep): the first keep tokens of the cache stay, plus BOS when the
// vocabulary adds one (a negative keep keeps the whole prompt), and half of the rest is
// discarded (Runner.ShiftContext), as often as the generation needs. Without it a full
// context ends generation with StopContext, as it does when the kept tokens leave nothing to
// discard. Speculative decoding shifts too; a prompt longer than the context is still an error.
func WithContextShift(keep int) GenerateOption {
	return func(c *genConfig) { c.shift = &keep }
}

// shiftKeep is the rows a context shift keeps for keep (WithContextShift) after a prompt of
// prompt tokens: llama.cpp's n_keep, which counts BOS on top and at most the prompt.
func (r *Runner) shiftKeep(keep, prompt int) int {
	if keep < 0 || keep > prompt {
		return prompt
	}
	if len(r.history) > 0 && r.history[0] == r.m.Tokenizer.BOS() && r.m.Tokenizer.Vocab().AddBOS {
		keep++
	}
	return min(keep, prompt)
}

// shiftFull makes room in a full cache keeping its first keep rows: llama.cpp's n_discard =
// (n_past - n_keep) / 2. ErrNoShift when that is nothing.
func (r *Runner) shiftFull(ctx context.Context, keep int) (int, error) {
	n := (r.pos - keep) / 2
	if n < 1 {
		return 0, fmt.Errorf("%w: %d tokens in the cache, %d kept: %w", ErrNoShift, r.pos, keep, ErrContextFull)
	}
	return n, r.shiftContext(ctx, keep, n)
}

// ShiftContext discards the n cache rows after the first keep, moves the rows after them down
// by n and rotates their keys back by n positions: the cache then holds Len()-n tokens, the
// kept ones first, and the next token fed goes after them, at position Len(). keep and n must
// lie in the cache and n be positive (else core.ErrInvalidArgument).
func (r *Runner) ShiftContext(ctx context.Context, keep, n int) error {
	ctx, leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	return r.shiftContext(ctx, keep, n)
}

func (r *Runner) shiftContext(ctx context.Context, keep, n int) error {
	if r.closed {
		return fmt.Errorf("llm: runner is closed: %w", core.ErrBadState)
	}
	if keep < 0 || n < 1 || keep+n > r.pos {
		return fmt.Errorf("llm: shift discarding %d tokens after %d: the cache holds %d: %w", n, keep, r.pos, core.ErrInvalidArgument)
	}
	moved := r.pos - keep - n
	if moved > 0 {
		rows := make([]int, moved)
		for i := range rows {
			rows[i] = n + i
		}
		if err := r.compactKV(ctx, int64(keep), rows); err != nil {
			return err
		}
		if err := r.rotateK(ctx, keep, moved, n); err != nil {
			return err
		}
	}
	r.history = append(r.history[:keep], r.history[keep+n:]...)
	r.pos -= n
	r.cfg.logger.Debug("llm: context shifted", "kept", keep, "discarded", n, "moved", moved)
	return nil
}

// rotateK rotates the K rows [from, from+count) of every layer by -n positions.
func (r *Runner) rotateK(ctx context.Context, from, count, n int) error {
	if r.shift == nil {
		sp, err := r.prepareShift(ctx)
		if err != nil {
			return err
		}
		r.shift = sp
	}
	sp := r.shift
	a := r.rt.Arena()
	delta := make([]int32, sp.rows)
	for i := range delta {
		delta[i] = int32(-n)
	}
	if r.m.Config.RopeFreqFactors == nil {
		copy(a.Bytes(sp.pos), core.EncodeI32(delta))
	} else {
		// the moved rows carry the attention factor already: turn them, do not scale them again
		cos, sin := r.m.Config.RotationTables(delta, r.cfg.ctxLen, 1)
		copy(a.Bytes(sp.cos), core.EncodeF32(cos))
		copy(a.Bytes(sp.sin), core.EncodeF32(sin))
	}
	// Whole blocks: the last one may reach past the moved rows into rows no token holds
	// (rotating them is harmless), never past the cache, whose rows beyond the context are
	// at least a block (the widest chunk or verify length).
	var chunks []sched.Chunk
	for row := int64(from); row < int64(from+count); row += sp.rows {
		chunks = append(chunks, sched.Chunk{Row: row, Index: len(chunks)})
	}
	if err := sp.prog.Run(ctx, chunks); err != nil {
		return fmt.Errorf("llm: %s: %w", sp.prog.Name(), err)
	}
	return nil
}

// shiftRows is the block of rows the shift program rotates per chunk: the cache has that many
// rows past the context (Runner.cap), so a block starting inside the context stays inside it.
func (r *Runner) shiftRows() int64 { return r.cap - int64(r.cfg.ctxLen) + 1 }

// prepareShift builds and prepares the K rotation: one stage, every layer's K rows in and out
// in place (each output element depends only on its own row's pair, read before it is
// written). Its nodes go where the plan puts the layer's decode nodes of the same name and
// op (the rope is named as the forward graphs' k_rope); a node no rule places goes with the
// layer's rope.
func (r *Runner) prepareShift(ctx context.Context) (*shiftProg, error) {
	c := r.m.Config
	rows := r.shiftRows()
	g, err := r.m.buildShiftGraph(rows, r.cfg.kv.K)
	if err != nil {
		return nil, err
	}
	a := r.rt.Arena()
	sp := &shiftProg{rows: rows}
	half := int64(c.RopeDims / 2)
	if c.RopeFreqFactors == nil {
		sp.pos, err = a.Alloc(4 * rows)
	} else if sp.cos, err = a.Alloc(rows * half * 4); err == nil {
		sp.sin, err = a.Alloc(rows * half * 4)
	}
	if err != nil {
		return nil, fmt.Errorf("llm: context shift inputs: %w", err)
	}
	units, fallback := make([]int, len(g.Nodes)), make([]int, len(g.Nodes))
	ropeUnit := make([]int, c.Layers)
	for l := range ropeUnit {
		probe := &core.Node{Name: fmt.Sprintf("blk.%d.k_rope", l), Op: core.OpRoPE}
		u, _, err := r.plan.Place(sched.PhaseDecode, l, probe)
		if err != nil {
			return nil, fmt.Errorf("llm: context shift: %w", err)
		}
		ropeUnit[l] = r.unitIdx[u]
	}
	for i, nd := range g.Nodes {
		l := r.layerOf(1, nd)
		u, fb, err := r.plan.Place(sched.PhaseDecode, l, nd)
		if errors.Is(err, sched.ErrNoRule) {
			units[i], fallback[i] = ropeUnit[l], -1
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("llm: context shift: %w", err)
		}
		if fb >= 0 {
			fb = r.unitIdx[fb]
		}
		units[i], fallback[i] = r.unitIdx[u], fb
	}
	kRow, _ := r.cfg.kv.rowBytes(c)
	st := sched.StageSpec{Name: "k shift", Graph: g, Units: units, Fallback: fallback}
	for _, t := range g.Inputs {
		switch t.Name {
		case "pos":
			st.IO = append(st.IO, sched.Binding{Span: sp.pos})
		case "rope_cos":
			st.IO = append(st.IO, sched.Binding{Span: sp.cos})
		case "rope_sin":
			st.IO = append(st.IO, sched.Binding{Span: sp.sin})
		default:
			var l int
			if _, err := fmt.Sscanf(t.Name, "blk.%d.k_cache", &l); err != nil || l < 0 || l >= c.Layers {
				return nil, fmt.Errorf("llm: no binding for shift input %q: %w", t.Name, core.ErrInternal)
			}
			st.IO = append(st.IO, sched.Binding{Span: r.kv[l][0], Stride: kRow})
		}
	}
	for l := range c.Layers {
		st.IO = append(st.IO, sched.Binding{Span: r.kv[l][0], Stride: kRow})
	}
	prog, err := r.rt.Compile(ctx, sched.ProgramSpec{Name: fmt.Sprintf("context shift (%d rows)", rows),
		Phase: sched.PhaseDecode, Lanes: 1, Stages: []sched.StageSpec{st}})
	if err != nil {
		return nil, fmt.Errorf("llm: context shift: %w", err)
	}
	sp.prog = prog
	return sp, nil
}

// buildShiftGraph builds the K rotation of rows cache rows of dtype kt in every layer: inputs
// the delta's positions (or RoPE tables) then "blk.<l>.k_cache" [rows, Hkv, D] per layer,
// outputs the rotated rows per layer.
func (m *Model) buildShiftGraph(rows int64, kt core.DType) (*core.Graph, error) {
	c := m.Config
	g := core.NewGraph()
	pos := m.addPosInputs(g, rows)
	var outs []*core.Tensor
	for l := range c.Layers {
		g.SetNamePrefix(fmt.Sprintf("blk.%d.", l))
		k := g.Input(fmt.Sprintf("blk.%d.k_cache", l), kt, rows, int64(c.KVHeads), int64(c.HeadDim))
		x := k
		switch kt {
		case core.F32:
		case core.Q8_0, core.Q4_0:
			x = g.Dequantize(k, 0)
		default:
			x = g.Cast(k, core.F32)
		}
		outs = append(outs, toKV(g, m.rope(g, "k_rope", x, pos, l), kt))
	}
	g.Output(outs...)
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("llm: building the context shift: %w", err)
	}
	return g, nil
}
