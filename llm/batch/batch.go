// Package batch is continuous batching: several sequences' decodes as one step over one copy
// of the weights.
package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/sched"
)

// ErrClosed: a decode reached a Batch after Close.
var ErrClosed = errors.New("batch: the batch is closed")

// maxBatch bounds the sequences of a Batch: each width up to it is a prepared program.
const maxBatch = 64

// Batch is continuous batching: n Runners, one sequence each, on one runtime and one copy of
// the weights, whose Decode calls made at the same time from different goroutines run as one
// step. A step's MATMULs read every weight once for all its sequences (M = the sequences in the
// step) where n independent runners would read them n times, which is what memory-bound decode
// pays for; each sequence's attention reads its own cache.
//
// Sequences join and leave between tokens: a step takes every Decode waiting when it starts,
// and waits a little (a fraction of the last step's time) for the sequences of the last step to
// come back, so that one slow sampler does not split the batch in two; a sequence that does not
// come back in that time has left (its generation ended) and the step runs without it. A
// Prefill runs its prompt one chunk at a time, and while other sequences decode, in short
// chunks (InterleaveChunk tokens) that ride in the decode steps, one chunk per step: the
// step's MATMULs carry the decoding rows and the chunk's rows at once (chunked prefill, as
// llama.cpp's mixed batches and vLLM do), reading the weights once for both, and attention
// runs per sequence. A new request's prompt costs each running stream a few rows more per
// step, never a separate pass over the weights, let alone a whole prompt.
// A step runs alone, through the runner's own decode program, when one sequence is decoding,
// which keeps a lone stream's speed.
//
// Each runner is used as any Runner is (Generate, NewChat, Prefill, Decode), from one goroutine
// at a time; the runners are the batch's and are closed by its Close.
type Batch struct {
	m       *llm.Model
	rt      *sched.Runtime // the first runner's, which all share
	runners []*llm.Runner
	slots   []*slot
	// kv are per layer every slot's K and V (slot i's rows start at i*cap), in rt's arena
	kv       [][2]sched.Span
	cap      int64
	rowBytes [2]int64 // one cache row of K and of V
	// progs are the batched decode programs by width (2 up to the runners; 0 and 1 unused)
	progs []*batchProg
	// mixed are the decode programs that also carry a prompt chunk of small rows, by the
	// decoding sequences (1 up to the runners less one; 0 unused)
	mixed []*batchProg
	// per row of a step, written before it runs: token ids, positions and, for models with
	// RoPE frequency factors, the cos and sin tables; per sequence, its query offset
	ids, pos, qoff, cos, sin sched.Span
	// outRows are, per sequence of a mixed step, the row whose logits it needs
	outRows sched.Span
	// small is the prefill chunk length used while others decode (0: the runners' own)
	small int
	// turn is held by a prefill chunk running beside no decoding: one at a time
	turn chan struct{}

	mu      sync.Mutex
	pending []*batchReq
	// chunks are prompt chunks queued while others decode: the stepper runs one after each step,
	// so a stream waits at most one chunk more per token and every prompt moves in turn
	chunks []*chunkJob
	// seen is, per slot, when the slot's sequence last left a step: one that left recently
	// comes back for the next step, which waits for it (a little) rather than run without it
	seen     []time.Time
	lastDur  time.Duration // the last step's time
	lastEnd  time.Time     // and when it ended
	stepping bool          // a step is running
	closed   bool
	arrive   chan struct{} // a decode was queued
	quit     chan struct{}
	done     chan struct{} // the stepper returned

	steps, rows, chunksRun, mixedRun atomic.Int64
}

// InterleaveChunk is the prefill chunk length of a Batch's runners while other sequences
// decode: a chunk of a few tokens costs a memory-bound step little more than a decode step,
// so the streams running wait about one step more per token while a prompt goes in.
const InterleaveChunk = 8

// batchProg is a batched decode program and the span of its logits (one row per sequence).
type batchProg struct {
	prog   *sched.Program
	logits sched.Span
}

// batchReq is one sequence's decode waiting for a step.
type batchReq struct {
	// ctx is the decode's, which holds the runner; the step does not end with it
	ctx   context.Context
	s     *slot
	token int32
	out   chan batchResult
}

type batchResult struct {
	logits []float32
	err    error
}

// chunkJob is one prompt chunk waiting for the stepper.
type chunkJob struct {
	ctx    context.Context
	s      *slot
	tokens []int32
	c      int  // the chunk length of the runner's programs it runs on alone
	last   bool // the prompt's last chunk: its sequence decodes next
	out    chan batchResult
}

// Stats counts a Batch's decode steps and the decoding rows they ran (Rows/Steps is the
// mean batch width), and the prompt chunks run while sequences decoded: Chunks in all, Mixed
// of them inside a decode step.
type Stats struct {
	Steps, Rows, Chunks, Mixed int64
}

// New prepares n runners on dev that decode together (see Batch). The options are
// llm.NewRunner's; W8A8 weights, a sparse FFN, calibration taps, verify lengths and hidden-state
// output are not batched and are refused (core.ErrUnsupported). With llm.WithRuntime the
// runtime must have one unit, dev's. An llm.Engine's batch is
// New(ctx, e.Model(), e.Device(), n, e.RunnerOptions()...), closed before the engine.
func New(ctx context.Context, m *llm.Model, dev core.Device, n int, opts ...llm.RunnerOption) (_ *Batch, err error) {
	if dev == nil || m == nil {
		return nil, fmt.Errorf("batch: nil model or device: %w", core.ErrInvalidArgument)
	}
	if n < 1 || n > maxBatch {
		return nil, fmt.Errorf("batch: %d sequences (1 to %d): %w", n, maxBatch, core.ErrInvalidArgument)
	}
	b := &Batch{m: m, arrive: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		turn: make(chan struct{}, 1), seen: make([]time.Time, n)}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.closeAll())
		}
	}()
	// the first runner opens the runtime (or takes WithRuntime's), the others share it and its
	// cache dtypes; each one's cache is its slot of the batch's (slot.Attach)
	for i := range n {
		sl := &slot{b: b, i: i}
		ropts := append(slices.Clone(opts), llm.WithSequenceHook(sl))
		if i > 0 {
			ropts = append(ropts, llm.WithRuntime(b.rt), llm.WithKVCacheTypes(b.runners[0].KVCacheTypes()))
		}
		r, err := llm.NewRunner(ctx, m, dev, ropts...)
		if err != nil {
			return nil, fmt.Errorf("batch: runner %d of %d: %w", i+1, n, err)
		}
		b.runners, b.slots = append(b.runners, r), append(b.slots, sl)
		if len(b.rt.Units()) != 1 {
			return nil, fmt.Errorf("batch: a runtime of %d units (one, the device's): %w", len(b.rt.Units()), core.ErrUnsupported)
		}
		if small := min(InterleaveChunk, r.ChunkSize()); small > 1 && small < r.ChunkSize() {
			b.small = small
			if sl.short, err = sl.seam.Prepare(ctx, small, false); err != nil {
				return nil, fmt.Errorf("batch: runner %d: prefill chunk %d: %w", i+1, small, err)
			}
		}
	}
	b.progs = make([]*batchProg, n+1)
	for w := 2; w <= n; w++ {
		if b.progs[w], err = b.compile(ctx, w, w); err != nil {
			return nil, err
		}
	}
	if b.small > 0 {
		b.mixed = make([]*batchProg, n)
		for w := 1; w < n; w++ {
			if b.mixed[w], err = b.compile(ctx, w+1, w+b.small); err != nil {
				return nil, err
			}
		}
	}
	go b.stepper()
	return b, nil
}

// Runners are the batch's runners, one sequence each.
func (b *Batch) Runners() []*llm.Runner { return slices.Clone(b.runners) }

// Stats counts the decode steps run so far.
func (b *Batch) Stats() Stats {
	return Stats{Steps: b.steps.Load(), Rows: b.rows.Load(), Chunks: b.chunksRun.Load(), Mixed: b.mixedRun.Load()}
}

// Close stops the steps (a decode still waiting fails with ErrClosed) and releases the
// runners, the programs and the runtime (not WithRuntime's). Closing twice is a no-op.
func (b *Batch) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.quit)
	<-b.done
	return b.closeAll()
}

// closeAll closes the runners that share the first one's runtime, the batched programs, then the
// first runner, which closes the runtime (unless it is WithRuntime's).
func (b *Batch) closeAll() error {
	var errs []error
	for _, r := range b.runners[min(1, len(b.runners)):] {
		errs = append(errs, r.Close())
	}
	for _, p := range append(slices.Clone(b.progs), b.mixed...) {
		if p != nil {
			errs = append(errs, p.prog.Close())
		}
	}
	if len(b.runners) > 0 {
		errs = append(errs, b.runners[0].Close())
	}
	return errors.Join(errs...)
}

// prefill is Runner.Prefill for slot s's runner. While others decode, the prompt goes in in
// short chunks that the stepper runs between steps; otherwise in the runner's own chunks, one
// prompt's chunk at a time.
func (b *Batch) prefill(ctx context.Context, s *slot, tokens []int32) ([]float32, error) {
	if err := s.seam.Check(tokens); err != nil {
		return nil, err
	}
	chunk := s.seam.Runner().ChunkSize()
	var logits []float32
	for start := 0; start < len(tokens); {
		var err error
		end := min(start+chunk, len(tokens))
		select {
		case b.turn <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// decoding is asked with the turn held: a prompt that waited for another's chunk may find
		// streams decoding by then
		if b.small > 0 && b.decoding() {
			<-b.turn
			end = min(start+b.small, len(tokens))
			logits, err = b.queueChunk(ctx, &chunkJob{ctx: ctx, s: s, tokens: tokens[start:end], c: b.small,
				last: end == len(tokens)})
		} else {
			// a chunk is padded to its program's rows: a short prompt (or tail) goes in in short
			// chunks rather than pay a long chunk's rows
			c := chunk
			if b.small > 0 && len(tokens)-start <= c/2 {
				c = b.small
			}
			end = min(start+c, len(tokens))
			logits, err = s.feed(ctx, tokens[start:end], c)
			if err == nil && end == len(tokens) {
				b.decodesNext(s)
			}
			<-b.turn
		}
		if err != nil {
			return nil, err
		}
		start = end
	}
	return logits, nil
}

// queueChunk has the stepper run one prompt chunk between two steps and waits for it. A caller
// whose ctx ends while the chunk waits leaves the queue; once running, the chunk finishes first.
func (b *Batch) queueChunk(ctx context.Context, job *chunkJob) ([]float32, error) {
	job.out = make(chan batchResult, 1)
	return enqueue(ctx, b, &b.chunks, job, job.out)
}

// decodesNext counts s, whose prompt just went in, among the sequences that decode: the next
// step waits for its first token, and a prompt that comes next goes in between steps.
func (b *Batch) decodesNext(s *slot) {
	b.mu.Lock()
	b.seen[s.i] = time.Now()
	b.mu.Unlock()
}

// wake tells the stepper something was queued.
func (b *Batch) wake() {
	select {
	case b.arrive <- struct{}{}:
	default:
	}
}

// decoding says whether other sequences are decoding: a step runs, waits to, or ended so
// recently that its sequences are sampling their next tokens.
func (b *Batch) decoding() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stepping || len(b.pending) > 0 || b.expected() > 0
}

// decode is Runner.Decode for slot s's runner: it queues the token for the next step and waits
// for its logits. A caller whose ctx ends while its token waits leaves the queue; once a step
// has taken it, the step finishes first (the cache row is written either way).
func (b *Batch) decode(ctx context.Context, s *slot, token int32) ([]float32, error) {
	if err := s.seam.Check([]int32{token}); err != nil {
		return nil, err
	}
	req := &batchReq{ctx: ctx, s: s, token: token, out: make(chan batchResult, 1)}
	return enqueue(ctx, b, &b.pending, req, req.out)
}

// enqueue queues item on q for the stepper and waits for its result. A caller whose ctx ends
// while the item waits takes it back; once the stepper has taken it, it finishes first (a
// decode's cache row, a chunk's rows, are written either way).
func enqueue[T comparable](ctx context.Context, b *Batch, q *[]T, item T, out <-chan batchResult) ([]float32, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	*q = append(*q, item)
	b.mu.Unlock()
	b.wake()
	select {
	case res := <-out:
		return res.logits, res.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if i := slices.Index(*q, item); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
		b.mu.Unlock()
		return nil, ctx.Err()
	}
	b.mu.Unlock()
	res := <-out
	return res.logits, res.err
}

// stepper runs the steps, a queued prompt chunk in each (or, when no program carries both,
// after it), until Close.
func (b *Batch) stepper() {
	defer close(b.done)
	for {
		reqs, job, ok := b.collect()
		if !ok {
			return
		}
		var mixed *batchResult
		if len(reqs) > 0 {
			t0 := time.Now()
			var res []batchResult
			if job != nil && len(reqs) < len(b.mixed) {
				res, mixed = b.mixedStep(reqs, job)
			} else {
				res = b.step(reqs)
			}
			dur := time.Since(t0)
			b.mu.Lock()
			b.lastDur, b.lastEnd, b.stepping = dur, time.Now(), false
			for _, q := range reqs {
				b.seen[q.s.i] = b.lastEnd
			}
			b.mu.Unlock()
			b.steps.Add(1)
			b.rows.Add(int64(len(reqs)))
			for i, q := range reqs {
				q.out <- res[i]
			}
		}
		if job != nil {
			var res batchResult
			if mixed != nil {
				res = *mixed
				b.mixedRun.Add(1)
			} else {
				res.logits, res.err = job.s.feed(job.ctx, job.tokens, job.c)
			}
			b.mu.Lock()
			b.stepping = false
			b.mu.Unlock()
			if job.last && res.err == nil {
				b.decodesNext(job.s)
			}
			b.chunksRun.Add(1)
			job.out <- res
		}
	}
}

// gatherWait is how long a step waits for the sequences of the last one to come back: a
// fraction of that step's time, so the wait costs little next to the step it fills.
func gatherWait(last time.Duration) time.Duration {
	return min(max(last/4, 200*time.Microsecond), 50*time.Millisecond)
}

// collect waits for the next step's decodes: at least one, and the sequences of the last steps
// as they come back (at most gatherWait); it takes every decode queued and the first prompt
// chunk queued. A chunk alone runs when no sequence decodes. ok is false after Close (the
// queued decodes and chunks fail).
func (b *Batch) collect() (reqs []*batchReq, job *chunkJob, ok bool) {
	var timer <-chan time.Time
	for {
		b.mu.Lock()
		if b.closed {
			for _, q := range b.pending {
				q.out <- batchResult{err: ErrClosed}
			}
			for _, j := range b.chunks {
				j.out <- batchResult{err: ErrClosed}
			}
			b.pending, b.chunks = nil, nil
			b.mu.Unlock()
			return nil, nil, false
		}
		n, e := len(b.pending), b.expected()
		if (n > 0 || len(b.chunks) > 0) && timer == nil {
			timer = time.After(gatherWait(b.lastDur))
		}
		if n > 0 && n >= e || n == 0 && e == 0 && len(b.chunks) > 0 {
			reqs, b.pending = b.pending, nil
			if len(b.chunks) > 0 {
				job, b.chunks = b.chunks[0], b.chunks[1:]
			}
			b.stepping = true
			b.mu.Unlock()
			return reqs, job, true
		}
		b.mu.Unlock()
		select {
		case <-b.arrive:
		case <-b.quit:
		case <-timer:
			// the missing ones left: run what came, and stop waiting for them
			b.mu.Lock()
			b.forgetAbsent()
			b.mu.Unlock()
		}
	}
}

// expected is how many sequences the next step waits for: the ones queued and the ones that
// left a step recently (they are sampling their next token). Waiting for the last step's count
// alone would let two sequences that once missed each other alternate in steps of one for good.
// Called with mu held.
func (b *Batch) expected() int {
	recent := 2*b.lastDur + 10*time.Millisecond
	queued := make([]bool, len(b.seen))
	for _, q := range b.pending {
		queued[q.s.i] = true
	}
	n := 0
	for i, t := range b.seen {
		if queued[i] || !t.IsZero() && time.Since(t) < recent {
			n++
		}
	}
	return n
}

// forgetAbsent stops the next steps waiting for the sequences not queued now. Called with mu
// held.
func (b *Batch) forgetAbsent() {
	queued := make([]bool, len(b.seen))
	for _, q := range b.pending {
		queued[q.s.i] = true
	}
	for i := range b.seen {
		if !queued[i] {
			b.seen[i] = time.Time{}
		}
	}
}

// step runs one decode step for reqs: alone through the runner's own decode program, or
// batched.
func (b *Batch) step(reqs []*batchReq) []batchResult {
	// the step serves several callers: one caller's end must not fail the others' tokens
	ctx := context.Background()
	res := make([]batchResult, len(reqs))
	if len(reqs) == 1 {
		q := reqs[0]
		res[0].logits, res[0].err = q.s.feed(context.WithoutCancel(q.ctx), []int32{q.token}, 1)
		return res
	}
	logits, err := b.run(ctx, reqs)
	for i := range res {
		if err != nil {
			res[i].err = err
			continue
		}
		res[i].logits = logits[i]
		reqs[i].s.seam.Commit([]int32{reqs[i].token})
	}
	return res
}

// run runs the batched program of len(reqs) sequences and returns each one's logits.
func (b *Batch) run(ctx context.Context, reqs []*batchReq) ([][]float32, error) {
	return b.runRows(ctx, b.progs[len(reqs)], reqs, nil)
}

// runRows runs p for the decoding reqs, and with job a prompt chunk after them (its tokens
// padded to the program's rows), and returns the logits of each sequence: after its token, or
// after the chunk's last token.
func (b *Batch) runRows(ctx context.Context, p *batchProg, reqs []*batchReq, job *chunkJob) ([][]float32, error) {
	n := len(reqs)
	a := b.rt.Arena()
	ids, pos, qoff := make([]int32, 0, n+b.small), make([]int32, 0, n+b.small), make([]int32, 0, n+1)
	rows := make([]int64, 0, 2*n+2)
	seq := func(s *slot) {
		base, at := int64(s.i)*b.cap, s.seam.Runner().Len()
		// slot 2i+1: the sequence's cache; 2i+2: its new K/V rows
		rows = append(rows, base, base+int64(at))
		qoff = append(qoff, int32(at))
	}
	for _, q := range reqs {
		ids, pos = append(ids, q.token), append(pos, int32(q.s.seam.Runner().Len()))
		seq(q.s)
	}
	if job != nil {
		// padding rows (id 0) sit past the prompt's last token, where the causal mask hides
		// them until real tokens overwrite them (as a padded prefill chunk's do)
		for i := range b.small {
			id := int32(0)
			if i < len(job.tokens) {
				id = job.tokens[i]
			}
			ids, pos = append(ids, id), append(pos, int32(job.s.seam.Runner().Len()+i))
		}
		seq(job.s)
	}
	copy(a.Bytes(b.ids), core.EncodeI32(ids))
	copy(a.Bytes(b.pos), core.EncodeI32(pos))
	copy(a.Bytes(b.qoff), core.EncodeI32(qoff))
	if job != nil {
		out := make([]int32, n+1)
		for i := range out {
			out[i] = int32(i)
		}
		out[n] = int32(n + len(job.tokens) - 1)
		copy(a.Bytes(b.outRows), core.EncodeI32(out))
	}
	if b.m.Config.RopeFreqFactors != nil {
		cos, sin := b.m.Config.RopeTables(pos, b.runners[0].ContextLength())
		copy(a.Bytes(b.cos), core.EncodeF32(cos))
		copy(a.Bytes(b.sin), core.EncodeF32(sin))
	}
	if err := p.prog.Run(ctx, []sched.Chunk{{Rows: rows}}); err != nil {
		return nil, fmt.Errorf("batch: %s: %w", p.prog.Name(), err)
	}
	V := int64(b.m.Config.Vocab)
	all := core.DecodeF32(a.Bytes(p.logits)[:int64(len(qoff))*V*4])
	out := make([][]float32, len(qoff))
	for i := range out {
		out[i] = all[int64(i)*V : int64(i+1)*V : int64(i+1)*V]
	}
	return out, nil
}

// mixedStep runs one decode step for reqs that also carries job's prompt chunk (a mixed
// program), and returns the decodes' results and the chunk's: the logits after its last token.
func (b *Batch) mixedStep(reqs []*batchReq, job *chunkJob) ([]batchResult, *batchResult) {
	res := make([]batchResult, len(reqs))
	logits, err := b.runRows(context.Background(), b.mixed[len(reqs)], reqs, job)
	for i, q := range reqs {
		if err != nil {
			res[i].err = err
			continue
		}
		res[i].logits = logits[i]
		q.s.seam.Commit([]int32{q.token})
	}
	if err != nil {
		return res, &batchResult{err: err}
	}
	job.s.seam.Commit(job.tokens)
	return res, &batchResult{logits: logits[len(reqs)]}
}
