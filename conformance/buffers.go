package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// Level 3: buffers. Zero-copy import of host memory and of a memfd, outputs bound at an offset inside a larger
// buffer (how a KV cache is appended), and two executions of one executable in parallel.

func bufferCases() []testCase {
	return []testCase{
		{name: "BUFFER(import-host)", level: 3, op: "ADD", dtype: "f32", run: (*runner).importHost},
		{name: "BUFFER(import-fd)", level: 3, op: "ADD", dtype: "f32", run: (*runner).importFD},
		{name: "BUFFER(offset-binding,kv-append)", level: 3, op: "ADD", dtype: "f32", run: (*runner).kvAppend},
		{name: "BUFFER(parallel-executions)", level: 3, op: "MATMUL", dtype: "f32/f32", run: (*runner).parallel},
	}
}

// importHost and importFD import memory the host sees for the inputs and the output, run,
// and read the result from the host's bytes without buffer_read or map: the backend must have
// written them there.
func (r *runner) importHost(ctx context.Context, res *CaseResult) { r.importCase(ctx, res, false) }

func (r *runner) importFD(ctx context.Context, res *CaseResult) { r.importCase(ctx, res, true) }

func (r *runner) importCase(ctx context.Context, res *CaseResult, fd bool) {
	capName, capBit := "import-host", core.CapImportHost
	if fd {
		capName, capBit = "import-fd", core.CapImportFD
	}
	if !r.dev.Info().Caps.Has(capBit) {
		res.Status, res.Reason = StatusUnsupported, "the device does not claim "+capName
		return
	}
	const n = 1000
	p := r.prepare(ctx, res, func(b *builder) {
		b.g.Output(b.g.Add(b.in("a", core.F32, core.Shape{n}, -1, 1), b.in("b", core.F32, core.Shape{n}, -1, 1)))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	want := r.reference(ctx, res, p)
	if want == nil {
		return
	}
	// each tensor's region starts on its own page, as a runtime's mmap'd weights or pinned
	// staging memory would
	const stride = (n*4 + 2*guardBytes + 4095) / 4096 * 4096
	const size = n*4 + 2*guardBytes
	var mem []byte
	var release func()
	var memfd int
	var err error
	if fd {
		memfd, mem, release, err = memfdMemory(3 * stride)
	} else {
		mem, release, err = hostMemory(3 * stride)
	}
	if err != nil {
		res.Status, res.Reason = StatusSkipped, fmt.Sprintf("no shareable host memory here: %v", err)
		return
	}
	defer release()
	for i := range mem {
		mem[i] = guardByte(i)
	}
	region := func(i int) []byte { return mem[i*stride : i*stride+size] }
	copy(region(0)[guardBytes:], p.inputs[0])
	copy(region(1)[guardBytes:], p.inputs[1])
	before := bytes.Clone(mem)
	cctx, _ := r.context(ctx)
	ex, err := p.exe.NewExecution()
	if err != nil {
		res.fail(errCategory(err, true), "execution_create: %v", err)
		return
	}
	// the execution goes before the buffers bound to it (defers run last-first, so the
	// buffers' closes are queued here, ahead of the execution's)
	var imported []core.Buffer
	defer func() {
		closeAndRecord(res, "execution", ex)
		for _, buf := range imported {
			closeAndRecord(res, "imported buffer", buf)
		}
	}()
	for i := range 3 {
		var buf core.Buffer
		if fd {
			buf, err = cctx.ImportFD(memfd, int64(i*stride), size)
		} else {
			buf, err = cctx.Import(region(i))
		}
		if err != nil {
			res.fail(CatCapabilityLie, "the device claims %s, but buffer_import failed: %v", capName, err)
			return
		}
		imported = append(imported, buf)
		if err := ex.Bind(i, buf, guardBytes); err != nil {
			res.fail(CatError, "execution_bind %d: %v", i, err)
			return
		}
	}
	if err := ex.Run(ctx); err != nil {
		res.fail(errCategory(err, true), "execute: %v", err)
		return
	}
	for i := range mem {
		inOut := i >= 2*stride+guardBytes && i < 2*stride+guardBytes+n*4
		if !inOut && mem[i] != before[i] {
			res.fail(CatOutOfBounds, "host byte %d outside the output changed", i)
			break
		}
	}
	got := region(2)[guardBytes : guardBytes+n*4]
	if bytes.Equal(got, before[2*stride+guardBytes:][:n*4]) {
		res.fail(CatCapabilityLie, "the host's output bytes are unchanged: the %s import is not zero-copy", capName)
		return
	}
	r.judgeOutputs(res, p, [][]byte{bytes.Clone(got)}, want)
}

// kvAppend binds the output of a [T,H,D] graph into a cache buffer of C rows at row pos, twice
// at two positions with one execution (rebinding), and the input at an offset too; the rest of
// the cache must keep its bytes.
func (r *runner) kvAppend(ctx context.Context, res *CaseResult) {
	const T, H, D, C = 3, 2, 8, 16
	rowBytes := int64(H * D * 4)
	p := r.prepare(ctx, res, func(b *builder) {
		// ADD, the op every backend is likeliest to have: the case is about bindings, and the
		// heterogeneous level rests on it (levels.go)
		k := b.in("k_new", core.F32, core.Shape{T, H, D}, -1, 1)
		b.g.Output(b.g.Add(k, k))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	cctx, _ := r.context(ctx)
	rng := caseRand(res.Name+"/cache", r.cfg.seed)
	cache := make([]byte, C*rowBytes)
	for i := range cache {
		cache[i] = byte(rng.IntN(256))
	}
	cbuf, err := cctx.Alloc(int64(len(cache)), core.BufferDevice)
	if err != nil {
		res.fail(CatError, "buffer_alloc: %v", err)
		return
	}
	defer closeAndRecord(res, "cache buffer", cbuf)
	if err := cbuf.Write(0, cache); err != nil {
		res.fail(CatError, "buffer_write: %v", err)
		return
	}
	inBytes := int64(len(p.inputs[0]))
	ibuf, err := cctx.Alloc(3*inBytes, core.BufferDevice)
	if err != nil {
		res.fail(CatError, "buffer_alloc: %v", err)
		return
	}
	defer closeAndRecord(res, "input buffer", ibuf)
	ex, err := p.exe.NewExecution()
	if err != nil {
		res.fail(errCategory(err, true), "execution_create: %v", err)
		return
	}
	defer closeAndRecord(res, "execution", ex)
	expect := bytes.Clone(cache)
	var got, want [][]byte
	for step, pos := range []int64{5, 11} {
		in := newBuilder(caseRand(fmt.Sprintf("%s/step%d", res.Name, step), r.cfg.seed)).
			randomData(core.F32, core.Shape{T, H, D}, -1, 1)
		p.inputs[0] = in
		ref := r.reference(ctx, res, p)
		if ref == nil {
			return
		}
		// the input lives in the middle third of its buffer
		if err := ibuf.Write(inBytes, in); err != nil {
			res.fail(CatError, "buffer_write: %v", err)
			return
		}
		if err := ex.Bind(0, ibuf, inBytes); err != nil {
			res.fail(CatError, "execution_bind input at offset %d: %v", inBytes, err)
			return
		}
		if err := ex.Bind(1, cbuf, pos*rowBytes); err != nil {
			res.fail(CatError, "execution_bind output at offset %d: %v", pos*rowBytes, err)
			return
		}
		if err := ex.Run(ctx); err != nil {
			res.fail(errCategory(err, true), "execute (append at row %d): %v", pos, err)
			return
		}
		out := make([]byte, T*rowBytes)
		if err := cbuf.Read(pos*rowBytes, out); err != nil {
			res.fail(CatError, "buffer_read: %v", err)
			return
		}
		copy(expect[pos*rowBytes:], out) // judged against the reference below
		got, want = append(got, out), append(want, ref[0])
	}
	all := make([]byte, len(cache))
	if err := cbuf.Read(0, all); err != nil {
		res.fail(CatError, "buffer_read: %v", err)
		return
	}
	if i := firstDiff(all, expect); i >= 0 {
		res.fail(CatOutOfBounds, "cache byte %d (row %d) outside the appended rows changed", i, int64(i)/rowBytes)
	}
	// judge both appends as outputs of one graph each
	for i := range got {
		r.judgeOutputs(res, p, got[i:i+1], want[i:i+1])
	}
}

// parallel runs one executable from two goroutines at once, each with its own execution and
// inputs, many times; every result must equal the same execution run alone.
func (r *runner) parallel(ctx context.Context, res *CaseResult) {
	const M, N, K, iters = 8, 48, 96, 20
	p := r.prepare(ctx, res, func(b *builder) {
		b.g.Output(b.g.SiLU(b.g.MatMul(b.in("a", core.F32, core.Shape{M, K}, -1, 1),
			b.cnst("w", core.F32, core.Shape{N, K}, -1, 1))))
	})
	if p == nil {
		return
	}
	defer closeAndRecord(res, "executable", p.exe)
	// sequential results for two input sets: the expectation for the parallel runs
	sets := [2][]byte{p.inputs[0], newBuilder(caseRand(res.Name+"/b", r.cfg.seed)).randomData(core.F32, core.Shape{M, K}, -1, 1)}
	var solo [2][]byte
	for i, in := range sets {
		p.inputs[0] = in
		got := r.verify(ctx, res, p)
		if got == nil {
			return
		}
		solo[i] = got[0]
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = r.loop(ctx, p, sets[w], solo[w], iters)
		}()
	}
	wg.Wait()
	for w, err := range errs {
		var nd *nondeterministic
		switch {
		case err == nil:
		case errors.As(err, &nd):
			res.fail(CatNondeterministic, "goroutine %d: %v", w, err)
		default:
			res.fail(errCategory(err, true), "goroutine %d: %v", w, err)
		}
	}
}

type nondeterministic struct{ iter, at int }

func (e *nondeterministic) Error() string {
	return fmt.Sprintf("run %d in parallel differs from the run alone at byte %d", e.iter, e.at)
}

// loop runs one execution iters times with in, comparing each output with want.
func (r *runner) loop(ctx context.Context, p *prepared, in, want []byte, iters int) (err error) {
	cctx, err := r.context(ctx)
	if err != nil {
		return err
	}
	ex, err := p.exe.NewExecution()
	if err != nil {
		return fmt.Errorf("execution_create: %w", err)
	}
	bufs := []core.Buffer{}
	defer func() {
		err = errors.Join(err, ex.Close())
		for _, b := range bufs {
			err = errors.Join(err, b.Close())
		}
	}()
	for i, size := range []int{len(in), len(want)} {
		b, err := cctx.Alloc(int64(size), core.BufferDevice)
		if err != nil {
			return fmt.Errorf("buffer_alloc: %w", err)
		}
		bufs = append(bufs, b)
		if err := ex.Bind(i, b, 0); err != nil {
			return fmt.Errorf("execution_bind %d: %w", i, err)
		}
	}
	if err := bufs[0].Write(0, in); err != nil {
		return fmt.Errorf("buffer_write: %w", err)
	}
	out := make([]byte, len(want))
	for it := range iters {
		if err := ex.Run(ctx); err != nil {
			return fmt.Errorf("execute %d: %w", it, err)
		}
		if err := bufs[1].Read(0, out); err != nil {
			return fmt.Errorf("buffer_read: %w", err)
		}
		if j := firstDiff(out, want); j >= 0 {
			return &nondeterministic{iter: it, at: j}
		}
	}
	return nil
}
