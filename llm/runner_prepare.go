package llm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/arch"
	"github.com/xpuhub/xpu/sched"
)

func (r *Runner) init(ctx context.Context) error {
	c := r.m.Config
	a := r.rt.Arena()
	al := a.Allocs()
	alloc := al.Alloc
	var err error
	kRow, vRow := r.cfg.kv.RowBytes(c)
	if r.cfg.seq != nil {
		r.kv, err = r.cfg.seq.Attach(&Seam{r: r})
	}
	for len(r.kv) < c.Layers {
		r.kv = append(r.kv, [2]sched.Span{alloc(r.cap * kRow), alloc(r.cap * vRow)})
	}
	if err == nil {
		err = al.Err
	}
	if err != nil {
		return fmt.Errorf("llm: KV cache of %d rows: %w", r.cap, err)
	}
	// Positions, query offsets and RoPE tables depend on the row only: written once, and each
	// chunk's stages are bound at its row.
	r.ids, r.posS, r.qoffS = alloc(4*r.cap), alloc(4*r.cap), alloc(4*r.cap)
	if f := c.RopeFreqFactors; f != nil {
		r.cos, r.sin = alloc(r.cap*int64(len(f))*4), alloc(r.cap*int64(len(f))*4)
	}
	if err = al.Err; err != nil {
		return fmt.Errorf("llm: position inputs: %w", err)
	}
	pos := make([]int32, r.cap)
	for i := range pos {
		pos[i] = int32(i)
	}
	copy(a.Bytes(r.posS), core.EncodeI32(pos))
	copy(a.Bytes(r.qoffS), core.EncodeI32(pos))
	if c.RopeFreqFactors != nil {
		cos, sin := c.RopeTables(pos, r.cfg.ctxLen)
		copy(a.Bytes(r.cos), core.EncodeF32(cos))
		copy(a.Bytes(r.sin), core.EncodeF32(sin))
	}
	lengths := r.programLengths()
	total := (len(lengths) + len(r.cfg.verify)) * (c.Layers + 1)
	if r.shards != nil {
		total += (len(r.shards.hooks) - 1) * (c.Layers + 1)
	}
	done := 0
	step := func() {
		done++
		if r.cfg.progress != nil {
			r.cfg.progress(done, total)
		}
	}
	if r.cfg.chunkHook != nil {
		return r.initHook(ctx, step, lengths)
	}
	// longest first: a unit's decode parts of a split weight are then rows of the whole weight
	// its prefill graphs uploaded, which the adapter passes as offsets and neon serves out of
	// the one repacked copy (uploaded the other way round, the part comes first and the whole
	// weight is a copy of its own)
	for _, n := range slices.Backward(lengths) {
		t0 := time.Now()
		cp, err := r.prepare(ctx, int64(n), step, false)
		if err != nil {
			return err
		}
		r.progs[n] = cp
		r.cfg.logger.Debug("llm: stage graphs prepared", "program", cp.prog.Name(), "took", time.Since(t0))
	}
	if r.shards != nil {
		if err := r.prepareShards(ctx, step); err != nil {
			return err
		}
	}
	return r.attachVerify(ctx, step)
}

// phaseOf is the plan phase a chunk length serves: the one-token graphs decode (and serve a
// lone prompt token).
func phaseOf(c int64) sched.Phase {
	if c == 1 {
		return sched.PhaseDecode
	}
	return sched.PhasePrefill
}

// layerOf is the layer plan rules see for node n of stage s: its "blk.N." name prefix; the
// embedding counts as layer 0 and the output head as the last layer.
func (r *Runner) layerOf(s int, n *core.Node) int {
	if rest, ok := strings.CutPrefix(n.Name, "blk."); ok {
		if i := strings.IndexByte(rest, '.'); i > 0 {
			if l, err := strconv.Atoi(rest[:i]); err == nil {
				return l
			}
		}
	}
	if s == 0 {
		return 0
	}
	return r.m.Config.Layers - 1
}

// prepare builds every stage for chunk length c, places its nodes by the plan and has sched
// partition, check and prepare them.
func (r *Runner) prepare(ctx context.Context, c int64, step func(), tree bool) (*chunkProg, error) {
	cfg := r.m.Config
	phase := phaseOf(c)
	a := r.rt.Arena()
	kRow, vRow := r.cfg.kv.RowBytes(cfg)
	spec := sched.ProgramSpec{Name: fmt.Sprintf("%s (chunk %d)", phase, c), Phase: phase, Lanes: 1}
	if tree {
		spec.Name = fmt.Sprintf("verify (tree %d)", c)
	}
	var stages []*core.Graph
	var reads [][]*core.Tensor // per stage, what its projection reader reads back
	var readers []ProjectionReader
	var hooked []HookStage // per stage, the stage hook's placement of its nodes
	hook := r.stageHook(phase, c, tree)
	hs := &Seam{r: r, step: step}
	st := arch.Stage{C: c, Capacity: r.cap, K: r.cfg.kv.K, V: r.cfg.kv.V, Tree: tree, Hidden: r.cfg.hidden}
	for s := 0; s <= cfg.Layers; s++ {
		var g *core.Graph
		var err error
		sb := &stageBuild{m: r.m}
		if r.cfg.proj != nil {
			sb.lin = r.cfg.proj.BeginStage()
		}
		var h HookStage
		switch {
		case hook != nil:
			h, err = hook.Stage(hs, s)
			if err == nil {
				err = h.check(s, len(r.unitIdx))
			}
			g = h.Graph
		default:
			g, err = r.m.stage(st, s, sb)
		}
		if err != nil {
			return nil, err
		}
		stages = append(stages, g)
		rd, _ := sb.lin.(ProjectionReader)
		readers, reads = append(readers, rd), append(reads, sb.back)
		hooked = append(hooked, h)
	}
	// Which units each stage uses decides the lanes: a prefill split over several units
	// pipelines chunks, each chunk in flight with its own activations.
	places := make([]sched.StagePlacement, len(stages))
	used := map[int]bool{}
	for s, g := range stages {
		p, err := r.plan.PlaceStage(phase, g, func(n *core.Node) int { return r.layerOf(s, n) }, hooked[s].Units, r.unitIdx)
		if err != nil {
			return nil, fmt.Errorf("llm: %w", err)
		}
		places[s] = p
		maps.Copy(used, p.Used)
	}
	if phase == sched.PhasePrefill && len(used) > 1 {
		spec.Lanes = 2
	}
	lanes := func(size int64) ([]sched.Span, error) {
		out := make([]sched.Span, spec.Lanes)
		for l := range out {
			var err error
			if out[l], err = a.Alloc(size); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	// Stage s reads x and q from pair (s+1)%2 of its lane and writes pair s%2: ping-pong, as a
	// stage's input and output must not alias.
	var x, q [2][]sched.Span
	var logits []sched.Span
	var err error
	for i := range 2 {
		if x[i], err = lanes(c * int64(cfg.Dim) * 4); err == nil {
			q[i], err = lanes(c * int64(cfg.Heads*cfg.HeadDim) * 4)
		}
		if err != nil {
			return nil, fmt.Errorf("llm: activations for chunk %d: %w", c, err)
		}
	}
	if logits, err = lanes(c * r.outWidth() * 4); err != nil {
		return nil, fmt.Errorf("llm: logits for chunk %d: %w", c, err)
	}
	half := int64(cfg.RopeDims / 2)
	cp := &chunkProg{c: c, logits: logits, tree: tree}
	if tree {
		sizes := []int64{4 * c, c * c}
		if cfg.RopeFreqFactors != nil {
			sizes = append(sizes, c*half*4, c*half*4)
		}
		spans := make([]sched.Span, 4)
		for i, n := range sizes {
			if spans[i], err = a.Alloc(n); err != nil {
				return nil, fmt.Errorf("llm: verify inputs for length %d: %w", c, err)
			}
		}
		cp.pos, cp.mask, cp.cos, cp.sin = spans[0], spans[1], spans[2], spans[3]
	}
	for s, g := range stages {
		in, out := (s+1)%2, s%2
		byName := r.positions()
		byName["x"], byName["q"] = sched.Binding{Lanes: x[in]}, sched.Binding{Lanes: q[in]}
		if tree {
			byName["pos"], byName["mask"] = sched.Binding{Span: cp.pos}, sched.Binding{Span: cp.mask}
			byName["rope_cos"], byName["rope_sin"] = sched.Binding{Span: cp.cos}, sched.Binding{Span: cp.sin}
		}
		if s > 0 {
			byName["k_cache"], byName["v_cache"] = sched.Binding{Span: r.kv[s-1][0]}, sched.Binding{Span: r.kv[s-1][1]}
		}
		var hookOut []sched.Binding
		if hook != nil {
			if hookOut, err = hook.Bind(hs, s, q[in], q[out], byName); err != nil {
				return nil, err
			}
		}
		st := sched.StageSpec{Name: fmt.Sprintf("stage %d", s), Layer: max(s-1, 0), Graph: g, Units: places[s].Units,
			Fallback: places[s].Fallback, Splits: places[s].Splits, Shared: hooked[s].Shared, Sharded: hook != nil}
		if len(st.Shared) > 0 {
			st.SharedUnits = [2]int{r.unitIdx[hooked[s].SharedUnits[0]], r.unitIdx[hooked[s].SharedUnits[1]]}
		}
		if s == 0 {
			st.Name = "embed"
		}
		if st.IO, err = bindInputs(g, st.Name, byName); err != nil {
			return nil, err
		}
		switch {
		case hook != nil && s < cfg.Layers:
			st.IO = append(append(st.IO, sched.Binding{Lanes: x[out]}), hookOut...)
		case s < cfg.Layers:
			// K and V of layer s are written straight into the cache at the chunk's row.
			st.IO = append(st.IO, sched.Binding{Lanes: x[out]}, sched.Binding{Lanes: q[out]},
				sched.Binding{Span: r.kv[s][0], Stride: kRow}, sched.Binding{Span: r.kv[s][1], Stride: vRow})
		default:
			st.IO = append(st.IO, sched.Binding{Lanes: logits})
		}
		for _, t := range reads[s] {
			l, err := lanes(t.DType.Bytes(t.Shape.NumElements()))
			if err != nil {
				return nil, fmt.Errorf("llm: projection read-backs for chunk %d: %w", c, err)
			}
			st.IO = append(st.IO, sched.Binding{Lanes: l})
		}
		spec.Stages = append(spec.Stages, st)
	}
	spec.Progress = step
	if po := r.cfg.phaseOpts[phase]; len(po) > 0 {
		spec.PrepareOptions = map[int]map[string]string{}
		for _, ru := range r.unitIdx {
			if r.rt.Units()[ru].Device().Info().Kind == core.DeviceCPU {
				spec.PrepareOptions[ru] = po
			}
		}
	}
	if readOf := readIndex(reads); r.cfg.stageChecks || readOf != nil {
		finite := r.finiteCheck(stages, nil)
		spec.Check = func(stage int, t *core.Tensor, data []byte) error {
			if readOf != nil {
				if i, ok := readOf[stage][t.Name]; ok {
					if err := readers[stage].Read(i, data); err != nil {
						return err
					}
				}
			}
			if !r.cfg.stageChecks {
				return nil
			}
			return finite.Check(stage, t, data)
		}
	}
	prog, err := r.rt.Compile(ctx, spec)
	if err != nil {
		if r.cfg.analyzeFirst && errors.Is(err, core.ErrUnsupported) && !errors.Is(err, sched.ErrPlanRefused) {
			// every unit's analysis accepted its nodes (Compile analyzes first), then prepare refused
			return nil, fmt.Errorf("llm: %s: %w: %w", spec.Name, ErrRefusedAfterAnalyze, err)
		}
		return nil, fmt.Errorf("llm: %s: %w", spec.Name, err)
	}
	cp.prog = prog
	return cp, nil
}

// readIndex maps, per stage, the name of each tensor read back to its index in reads[stage]
// (nil when no stage reads any back): a program's Check is handed tensors by name.
func readIndex(reads [][]*core.Tensor) []map[string]int {
	var idx []map[string]int
	for s, ts := range reads {
		for i, t := range ts {
			if idx == nil {
				idx = make([]map[string]int, len(reads))
			}
			if idx[s] == nil {
				idx[s] = map[string]int{}
			}
			idx[s][t.Name] = i
		}
	}
	return idx
}
