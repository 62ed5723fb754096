package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// guardBytes surround every tensor the suite binds. 64 keeps the tensor as aligned as the
// buffer itself.
const guardBytes = 64

// Fill patterns of output bytes before each of the two runs: the first reads as NaN in every
// float dtype (so an element never written fails as NaN), the second differs from the first (so
// an element written only sometimes fails as nondeterministic).
const (
	fillFirst  = 0xFF
	fillSecond = 0x5A
)

// graphSpec is a case that runs one graph: build adds inputs, nodes and outputs.
type graphSpec struct {
	build func(b *builder)
	// expectErr: execution must fail with this sentinel (a bad id, say); no output is compared.
	expectErr error
}

func graphCase(level int, op, dtype, name string, s graphSpec) testCase {
	return testCase{name: name, level: level, op: op, dtype: dtype,
		run: func(r *runner, ctx context.Context, res *CaseResult) { r.runGraph(ctx, res, s) }}
}

// prepared is a graph the backend accepted and compiled, with what judging it needs.
type prepared struct {
	g      *core.Graph
	inputs [][]byte
	// refInputs, when set, are the inputs the reference sees instead: the same values where
	// the backend may read, zeros where it must not (garbage in a KV cache past its length).
	refInputs [][]byte
	exe       core.Executable
	th        Threshold
	prec      core.Precision // the lowest precision graph_analyze reported
}

// prepare builds the case's graph and takes it through op_support, graph_analyze and prepare.
// It returns nil when the case is over (unsupported, or failed: res says which).
func (r *runner) prepare(ctx context.Context, res *CaseResult, build func(b *builder)) *prepared {
	b := newBuilder(caseRand(res.Name, r.cfg.seed))
	build(b)
	g, inputs, err := b.done()
	if err != nil {
		res.fail(CatError, "the suite could not build the case: %v", err)
		return nil
	}
	for _, n := range g.Nodes {
		if q := core.QueryFor(n); r.dev.OpSupport(q) == core.VerdictNo {
			res.Status = StatusUnsupported
			res.Reason = fmt.Sprintf("op_support: NO for %s (%s %s/%s -> %s, rank %d)", n.Name, q.Op,
				q.DTypeIn, q.DTypeWeight, q.DTypeOut, q.Rank)
			return nil
		}
	}
	cctx, err := r.context(ctx)
	if err != nil {
		res.fail(errCategory(err, false), "context_create: %v", err)
		return nil
	}
	verdicts, err := cctx.Analyze(ctx, g)
	if err != nil {
		if errors.Is(err, core.ErrUnsupported) {
			res.Status, res.Reason = StatusUnsupported, fmt.Sprintf("graph_analyze: %v", err)
			return nil
		}
		res.fail(errCategory(err, false), "graph_analyze: %v", err)
		return nil
	}
	if len(verdicts) != len(g.Nodes) {
		res.fail(CatError, "graph_analyze gave %d verdicts for %d nodes", len(verdicts), len(g.Nodes))
		return nil
	}
	prec := core.PrecDefault
	for i, v := range verdicts {
		if !v.Supported {
			if v.Reason == "" {
				res.fail(CatError, "graph_analyze refused node %s without a reason (the ABI requires one)",
					g.Nodes[i].Name)
				return nil
			}
			res.Status = StatusUnsupported
			res.Reason = fmt.Sprintf("graph_analyze: %s: %s", g.Nodes[i].Name, v.Reason)
			return nil
		}
		if precisionRank(v.Precision) > precisionRank(prec) {
			prec = v.Precision
		}
	}
	res.Precision = prec.String()
	th, ok := r.cfg.tolerances.Lookup(res.Op, res.DType, res.Precision)
	if !ok {
		res.fail(CatError, "TOLERANCES.md has no row for op %s, dtype %s, precision %s", res.Op, res.DType,
			res.Precision)
		return nil
	}
	res.Threshold = &th
	exe, err := cctx.Prepare(ctx, g)
	if err != nil {
		cat := CatCapabilityLie
		if errors.Is(err, core.ErrBackendCrashed) || errors.Is(err, core.ErrTimeout) {
			cat = errCategory(err, false)
		}
		res.fail(cat, "graph_analyze accepted every node, then prepare failed: %v", err)
		return nil
	}
	if r.cfg.analyzeOnly {
		closeAndRecord(res, "executable", exe)
		res.Reason = analyzedOnly
		return nil
	}
	return &prepared{g: g, inputs: inputs, exe: exe, th: th, prec: prec}
}

// reference runs the reference on the case's inputs (or the inputs meant for it).
func (r *runner) reference(ctx context.Context, res *CaseResult, p *prepared) [][]byte {
	in := p.inputs
	if p.refInputs != nil {
		in = p.refInputs
	}
	if p.prec == core.PrecF16 {
		in = halfInputs(p.g, in)
	}
	out, err := r.cfg.reference(ctx, p.g, in)
	if err == nil && len(out) != len(p.g.Outputs) {
		err = fmt.Errorf("%d outputs for %d", len(out), len(p.g.Outputs))
	}
	if err != nil {
		res.fail(CatError, "the reference failed (a suite bug): %v", err)
		return nil
	}
	return out
}

// halfInputs gives the f32 graph inputs rounded to f16, the others as they are. A backend that
// reports f16 precision holds its f32 inputs as half values (the QNN HTP's FP16 graphs), so
// the reference reads the same values: an op case then measures the op's own arithmetic, not
// the rounding of inputs it was never able to hold, which the GRAPH and MODEL cases still
// carry end to end.
func halfInputs(g *core.Graph, in [][]byte) [][]byte {
	out := make([][]byte, len(in))
	for i, b := range in {
		out[i] = b
		if i >= len(g.Inputs) || g.Inputs[i].DType != core.F32 {
			continue
		}
		xs := core.DecodeF32(b)
		for j, x := range xs {
			xs[j] = core.F16ToF32(core.F32ToF16(x))
		}
		out[i] = core.EncodeF32(xs)
	}
	return out
}

func (r *runner) runGraph(ctx context.Context, res *CaseResult, s graphSpec) {
	p := r.prepare(ctx, res, s.build)
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	if s.expectErr != nil {
		_, err := r.execute(ctx, res, p, fillFirst)
		switch {
		case err == nil:
			res.fail(CatError, "execution succeeded; OPS.md requires it to fail with %v", s.expectErr)
		case errors.Is(err, core.ErrBackendCrashed) || errors.Is(err, core.ErrTimeout):
			res.fail(errCategory(err, false), "execute: %v", err)
		case !errors.Is(err, s.expectErr):
			res.fail(CatError, "execution failed with %v; OPS.md requires %v", err, s.expectErr)
		}
		return
	}
	r.verify(ctx, res, p)
}

// verify runs the reference and the backend (twice) on the case's inputs and judges the
// outputs. It returns the backend's outputs, or nil when either run failed.
func (r *runner) verify(ctx context.Context, res *CaseResult, p *prepared) [][]byte {
	want := r.reference(ctx, res, p)
	if want == nil {
		return nil
	}
	got := r.runTwice(ctx, res, p)
	if got == nil {
		return nil
	}
	r.judgeOutputs(res, p, got, want)
	return got
}

// runTwice executes the prepared graph twice, checking guards and that both runs give the same
// bytes. It returns the first run's outputs, or nil when execution failed.
func (r *runner) runTwice(ctx context.Context, res *CaseResult, p *prepared) [][]byte {
	got, err := r.execute(ctx, res, p, fillFirst)
	if err != nil {
		res.fail(errCategory(err, true), "execute: %v", err)
		return nil
	}
	again, err := r.execute(ctx, res, p, fillSecond)
	if err != nil {
		res.fail(errCategory(err, true), "second execute: %v", err)
		return got
	}
	for i := range got {
		if j := firstDiff(got[i], again[i]); j >= 0 {
			res.fail(CatNondeterministic, "output %s: two runs differ, first at byte %d", p.g.Outputs[i].Name, j)
		}
	}
	return got
}

// judgeOutputs compares each output with the reference under the case's threshold.
func (r *runner) judgeOutputs(res *CaseResult, p *prepared, got, want [][]byte) {
	var worstNMSE, worstAbs float64
	if res.NMSE != nil && res.MaxAbs != nil { // an earlier run of the same case
		worstNMSE, worstAbs = *res.NMSE, *res.MaxAbs
	}
	for i, t := range p.g.Outputs {
		scale := outputScale(p.g, t)
		gv, err1 := decode(t.DType, got[i], scale)
		wv, err2 := decode(t.DType, want[i], scale)
		if err := errors.Join(err1, err2); err != nil || len(gv) != len(wv) {
			res.fail(CatError, "output %s: cannot decode (%v; %d vs %d values)", t.Name, err, len(gv), len(wv))
			continue
		}
		m := compareValues(gv, wv, p.th.Exact(), nmseFloor(t.DType, res.Precision))
		judge(res, t.Name, m, gv, wv, p.th)
		worstNMSE, worstAbs = max(worstNMSE, m.nmse), max(worstAbs, m.maxAbs)
	}
	res.NMSE, res.MaxAbs = finitePtr(worstNMSE), finitePtr(worstAbs)
}

// guarded is a buffer holding one tensor at offset guardBytes, with known bytes around it.
type guarded struct {
	buf  core.Buffer
	n    int
	want []byte // the whole buffer's expected content (the tensor part only for inputs)
}

func guardByte(i int) byte { return byte(0xC3 ^ (i * 29)) }

// newGuarded allocates guard + n + guard bytes: data (or fill when data is nil) in the middle.
func newGuarded(cctx core.Context, data []byte, n int, fill byte) (*guarded, error) {
	content := make([]byte, n+2*guardBytes)
	for i := range content {
		content[i] = guardByte(i)
	}
	mid := content[guardBytes : guardBytes+n]
	if data != nil {
		copy(mid, data)
	} else {
		for i := range mid {
			mid[i] = fill
		}
	}
	buf, err := cctx.Alloc(int64(len(content)), core.BufferDevice)
	if err != nil {
		return nil, fmt.Errorf("buffer_alloc %d bytes: %w", len(content), err)
	}
	if err := buf.Write(0, content); err != nil {
		buf.Close()
		return nil, fmt.Errorf("buffer_write: %w", err)
	}
	return &guarded{buf: buf, n: n, want: content}, nil
}

// check reads the buffer back and records writes outside the tensor (and, for an input,
// inside it). It returns the tensor's bytes.
func (gb *guarded) check(res *CaseResult, what string, input bool) ([]byte, error) {
	all := make([]byte, len(gb.want))
	if err := gb.buf.Read(0, all); err != nil {
		return nil, fmt.Errorf("buffer_read: %w", err)
	}
	lo, hi := guardBytes, guardBytes+gb.n
	if input {
		lo, hi = 0, 0
	}
	for i := range all {
		if i >= lo && i < hi {
			continue
		}
		if all[i] != gb.want[i] {
			rel := i - guardBytes
			where := fmt.Sprintf("byte %d after its end", rel-gb.n+1)
			switch {
			case rel < 0:
				where = fmt.Sprintf("byte %d before its start", -rel)
			case rel < gb.n:
				where = fmt.Sprintf("byte %d of the input itself", rel)
			}
			res.fail(CatOutOfBounds, "%s: the backend wrote outside the tensor: %s changed", what, where)
			break
		}
	}
	return all[guardBytes : guardBytes+gb.n], nil
}

// execute binds fresh guarded buffers for every input and output, runs once and checks the
// guards. It returns the output bytes and the execution's error.
func (r *runner) execute(ctx context.Context, res *CaseResult, p *prepared, fill byte) ([][]byte, error) {
	cctx, err := r.context(ctx)
	if err != nil {
		return nil, err
	}
	ex, err := p.exe.NewExecution()
	if err != nil {
		return nil, fmt.Errorf("execution_create: %w", err)
	}
	var bufs []*guarded
	defer func() {
		closeAndRecord(res, "execution", ex)
		for _, gb := range bufs {
			closeAndRecord(res, "buffer", gb.buf)
		}
	}()
	ios := append(append([]*core.Tensor(nil), p.g.Inputs...), p.g.Outputs...)
	for i, t := range ios {
		var data []byte
		if i < len(p.g.Inputs) {
			data = p.inputs[i]
		}
		gb, err := newGuarded(cctx, data, int(t.Bytes()), fill)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Name, err)
		}
		bufs = append(bufs, gb)
		if err := ex.Bind(i, gb.buf, guardBytes); err != nil {
			return nil, fmt.Errorf("execution_bind %d (%s): %w", i, t.Name, err)
		}
	}
	runErr := ex.Run(ctx)
	outs := make([][]byte, len(p.g.Outputs))
	for i, gb := range bufs {
		isIn := i < len(p.g.Inputs)
		what := "output " + ios[i].Name
		if isIn {
			what = "input " + ios[i].Name
		}
		data, err := gb.check(res, what, isIn)
		if err != nil {
			return nil, errors.Join(runErr, err)
		}
		if !isIn {
			outs[i-len(p.g.Inputs)] = data
		}
	}
	return outs, runErr
}

type closer interface{ Close() error }

// closeAndRecord closes c; a failure to release is a failure of the case.
func closeAndRecord(res *CaseResult, what string, c closer) {
	if err := c.Close(); err != nil {
		res.fail(errCategory(err, false), "releasing the %s: %v", what, err)
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// finitePtr keeps JSON encodable: NaN and Inf become the largest float64.
func finitePtr(v float64) *float64 {
	if v != v || v > 1.7e308 {
		v = 1.7976931348623157e308
	}
	return &v
}
