package sparse

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/sparse/host"
)

// The runtime: the host half of the sparse FFN, an host.FFN over a sidecar.
//
// The memory budget is split into the fixed region (what the runner holds whatever the plan:
// non-FFN weights, KV cache, predictors; FixedRegion), the hot region (each layer's most
// frequent neurons, resident from Load on: rows [0, hot_l) of its hot-first bundle matrix) and
// the cold region (slots shared by every layer's other neurons, a neuron-granular cache with
// LRU or LFU replacement). The runner's bundle cache is the hot rows, layer after layer, then
// the cold slots.
//
// Per layer and chunk, Select unions the neurons the predictor says the chunk's tokens use;
// hot rows and cold hits go to now (the runner computes them at once), misses get a slot and go
// to later, and their reads are queued to a single I/O worker that reads them with pread
// (O_DIRECT where the filesystem allows), coalescing rows near each other in the file and
// keeping several reads in flight (WithReaders), while the runner computes now. The runner's
// wait blocks until the layer's reads are in. A one-token Select also queues the reads of the
// next layer's predicted neurons (WithPrefetch), which then load while the runner computes the
// rest of this layer and the next one's attention.
//
// The cold slots are sized so that any one layer's selection fits (demoting the least frequent
// hot rows when the budget is short). A budget too small even for one layer's neurons runs
// bounded: a selection that does not fit loses its least frequent misses (Stats.Dropped), so
// decoding is approximate; a budget without room for the fixed region is an error.

// Runtime is the sparse FFN's host half over a sidecar: it implements host.FFN. Layout,
// Load, Select and the wait functions are called by one goroutine (the runner's); Stats may be
// called from any goroutine.
type Runtime struct {
	cfg      runtimeConfig
	sc       *Sidecar
	L, F, D  int
	rowBytes int64
	lay      host.Layout
	split    budgetSplit
	hotBase  []int64 // per layer, the cache row of its bundle row 0
	coldBase int64   // cache row of cold slot 0

	trained   *Trained // the sidecar's: thresholds (and computes logits when Select gets none)
	host      Predictor
	threshold float32

	file    *bundleFile
	w       *ioWorker
	workerQ sync.WaitGroup
	// Requests go to the worker in order of seq and complete in that order: inflight holds
	// those not completed yet (at most a prefetch, a Select's misses and the next prefetch),
	// reqs the buffers, reused by seq modulo their count.
	reqs      [4]ioReq
	inflight  []*ioReq
	issued    int64 // seq of the last request queued
	completed int64 // seq of the last request completed
	needSeq   int64 // the last Select's lists are in once completed reaches it
	reqErr    error
	loaded    bool
	closed    bool
	closeMu   sync.Once
	closeEr   error

	// cold cache: slot → layer·F + row (-1 empty) and back
	slotKey []int32
	where   []int32
	slotSeq []int64 // seq of the request that loads the slot's neuron (loaded once completed)
	slotPf  []bool  // the slot's neuron was prefetched and not selected since
	pfLog   []float32
	free    []int32
	ev      evictor
	hits    []int32 // slots of the selection in progress that were hits (pinned)

	// selection scratch, reused by every Select (allocation-free in steady state)
	mark    []uint32
	epoch   uint32
	active  []int32
	missRow []int32
	predBuf []int32
	// recall sampling
	selects  int64
	predMark []bool
	gateRow  []float32

	waitFn  func() error
	lastRet time.Time
	pinned  [][]byte // the fixed region's tensors locked by WithPinnedFixed

	mu sync.Mutex
	st RuntimeStats
}

// NewRuntime sizes the budget for m and the sidecar sc (opened for m, e.g. with OpenFor), opens
// path (the sidecar file) for reads and starts the I/O worker. Close stops it; sc stays the
// caller's and must stay open until then.
func NewRuntime(ctx context.Context, m *llm.Model, sc *Sidecar, path string, opts ...RuntimeOption) (*Runtime, error) {
	if m == nil || sc == nil {
		return nil, fmt.Errorf("sparse: runtime needs a model and a sidecar: %w", core.ErrInvalidArgument)
	}
	cfg := runtimeConfig{ctxLen: min(m.Config.ContextLength, 4096), kv: core.F32, gapBytes: 32 << 10, stagingBytes: 1 << 20, readers: 16, prefetch: true}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	c := m.Config
	switch {
	case cfg.ctxLen < 1 || !cfg.kv.Valid():
		return nil, fmt.Errorf("sparse: runtime context %d of %s: %w", cfg.ctxLen, cfg.kv, core.ErrInvalidArgument)
	case math.IsNaN(float64(cfg.thOffset)) || math.IsInf(float64(cfg.thOffset), 0):
		return nil, fmt.Errorf("sparse: threshold offset %v: %w", cfg.thOffset, core.ErrInvalidArgument)
	case cfg.gapBytes < 0:
		return nil, fmt.Errorf("sparse: coalescing gap %d bytes: %w", cfg.gapBytes, core.ErrInvalidArgument)
	case cfg.budget < 0 || cfg.recallEvery < 0 || cfg.readers < 1 || cfg.readers > 64:
		return nil, fmt.Errorf("sparse: budget %d, recall sampling every %d, %d readers (1 to 64): %w",
			cfg.budget, cfg.recallEvery, cfg.readers, core.ErrInvalidArgument)
	case cfg.evict != EvictLRU && cfg.evict != EvictLeastFrequent:
		return nil, fmt.Errorf("sparse: eviction policy %d: %w", cfg.evict, core.ErrInvalidArgument)
	case c.Layers != sc.Layers() || c.Dim != sc.D || c.FFN != sc.F:
		return nil, fmt.Errorf("%w: sidecar has %d layers, dim %d, ffn %d; the model %d, %d, %d",
			ErrMismatch, sc.Layers(), sc.D, sc.F, c.Layers, c.Dim, c.FFN)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, sc: sc, L: sc.Layers(), F: sc.F, D: sc.D, rowBytes: sc.RowBytes}
	act := core.SparseReLU
	if sc.Activation == ActReLU2 {
		act = core.SparseReLU2
	}
	r.lay = host.Layout{DType: sc.BundleType, RowLen: int64(BundleWidth(sc.D, sc.Gated)), Neurons: sc.F, Act: act, Ungated: !sc.Gated}
	r.threshold = sc.PredThreshold + cfg.thOffset
	if cfg.pred != nil {
		r.host = cfg.pred
	} else {
		// The graphs take the sidecar's F16 predictors as they are mapped: no copy on the heap.
		for _, ly := range sc.layers {
			r.lay.Predictors = append(r.lay.Predictors, host.Predictor{Rank: sc.PredRank,
				A: ly.predA, B: ly.predB, Bias: core.EncodeF32(ly.bias)})
		}
	}

	budget := cfg.budget
	if budget == 0 {
		budget = int64(sc.BudgetBytes)
	}
	fx := FixedRegion(m, cfg.ctxLen, cfg.kv, sc.PredRank)
	var err error
	r.split, err = splitBudget(budget, fx, int64(cfg.readers)*stagingSize(cfg.stagingBytes, r.rowBytes), stagingSize(0, r.rowBytes), r.rowBytes, r.F,
		sc.HotCounts, func(l, i int) float32 { return sc.Freq(l)[i] }, !cfg.plannedHot)
	if err != nil {
		return nil, fmt.Errorf("%w (context %d, %s KV cache)", err, cfg.ctxLen, cfg.kv)
	}
	staging := r.split.Staging
	if r.split.Demoted > 0 {
		cfg.log.Debug("sparse: budget short of the sidecar's hot rows", "demoted", r.split.Demoted, "budget", budget)
	}
	if r.split.Bounded {
		cfg.log.Debug("sparse: budget below one layer's neurons: selections that do not fit lose their least frequent neurons",
			"budget", budget, "cold_slots", r.split.Slots, "neurons", r.F)
	}
	r.hotBase = make([]int64, r.L)
	for l, h := range r.split.Hot {
		r.hotBase[l] = r.coldBase
		r.coldBase += int64(h)
	}
	r.lay.Rows = r.coldBase + r.split.Slots
	r.lay.AllResident = r.coldBase == int64(r.L)*int64(r.F)

	// The file must hold every bundle the header promises (a truncated copy fails here rather
	// than on the first miss of its last layer).
	bases := make([]int64, r.L)
	var end int64
	for l := range bases {
		bases[l] = sc.BundleOffset(l)
		end = max(end, bases[l]+int64(r.F)*r.rowBytes)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("sparse: %w", err)
	}
	if fi.Size() < end {
		return nil, fmt.Errorf("%w: %s is %d bytes, its bundles end at %d (truncated?)", ErrFormat, path, fi.Size(), end)
	}
	if r.file, err = openBundleFile(path, cfg.buffered, cfg.log); err != nil {
		return nil, err
	}

	slots := int(r.split.Slots)
	r.slotKey = make([]int32, slots)
	r.where = make([]int32, r.L*r.F)
	r.free = make([]int32, 0, slots)
	r.hits = make([]int32, 0, r.F)
	r.mark = make([]uint32, r.F)
	r.active = make([]int32, 0, r.F)
	r.missRow = make([]int32, 0, r.F)
	r.predBuf = make([]int32, 0, r.F)
	r.predMark = make([]bool, r.F)
	r.gateRow = make([]float32, r.D)
	for k := range r.reqs {
		r.reqs[k].rows = make([]uint64, 0, r.F)
	}
	r.inflight = make([]*ioReq, 0, len(r.reqs))
	r.slotSeq = make([]int64, slots)
	r.slotPf = make([]bool, slots)
	// With every row resident there is nothing to read ahead: the host predictor would only
	// cost time.
	if cfg.prefetch && r.host == nil && slots > 0 {
		r.pfLog = make([]float32, r.F)
		// The runner computes the next layer's logits in the graph (Select's next).
		r.lay.LookAhead = true
	}
	r.resetCold()
	// Each reader gets an equal share of the staging buffer; a budget that left only the
	// minimum reads one span at a time.
	readers := cfg.readers
	if staging < int64(readers)*stagingSize(cfg.stagingBytes, r.rowBytes) {
		readers = 1
	}
	per := staging / int64(readers) &^ (ioAlign - 1)
	bufs := make([][]byte, readers)
	for k := range bufs {
		bufs[k] = alignedBuf(int(per))
	}
	r.w = &ioWorker{file: r.file, staging: bufs, rowBytes: r.rowBytes, coldBase: r.coldBase, bases: bases,
		gap: cfg.gapBytes / r.rowBytes, reqs: make(chan *ioReq, len(r.reqs)), done: make(chan error, len(r.reqs))}
	r.workerQ.Add(1)
	go func() {
		defer r.workerQ.Done()
		r.w.run()
	}()
	r.waitFn = r.wait
	var pinnedBytes int64
	var pinErr error
	if cfg.pin {
		pinnedBytes, pinErr = r.pinFixed(m)
		if pinErr != nil {
			cfg.log.Debug("sparse: fixed region not pinned", "err", pinErr)
		}
	}
	r.st = RuntimeStats{PinnedBytes: pinnedBytes, PinError: errString(pinErr), Budget: budget, FixedBytes: fx.Total(), HotBytes: r.coldBase * r.rowBytes,
		ColdBytes: r.split.Slots * r.rowBytes, StagingBytes: staging, RowBytes: r.rowBytes, HotRowsResident: r.coldBase,
		ColdSlots: r.split.Slots, Demoted: int64(r.split.Demoted), Promoted: int64(r.split.Promoted), Eviction: cfg.evict, Bounded: r.split.Bounded}
	cfg.log.Debug("sparse: runtime", "budget", budget, "fixed", fx.Total(), "hot_rows", r.coldBase, "cold_slots", r.split.Slots,
		"direct", r.file.direct.Load())
	return r, nil
}

// pinFixed locks every non-FFN tensor of m's mapping and the predictors of the sidecar's (the
// graphs read both every token); on a refusal it unlocks what it locked.
func (r *Runtime) pinFixed(m *llm.Model) (int64, error) {
	var n int64
	pin := func(name string, b []byte) error {
		if len(b) == 0 {
			return nil
		}
		if err := pinPages(b); err != nil {
			r.unpin()
			return fmt.Errorf("sparse: pinning %s (%s, after %s): %w", name, mib(int64(len(b))), mib(n), err)
		}
		r.pinned = append(r.pinned, b)
		n += int64(len(b))
		return nil
	}
	for i := range m.File.Tensors {
		if t := &m.File.Tensors[i]; !isFFNWeight(t.Name) {
			if err := pin(t.Name, m.File.TensorData(t)); err != nil {
				return 0, err
			}
		}
	}
	if r.host == nil {
		for l, ly := range r.sc.layers {
			if err := pin(fmt.Sprintf("layer %d's predictor A", l), ly.predA); err != nil {
				return 0, err
			}
			if err := pin(fmt.Sprintf("layer %d's predictor B", l), ly.predB); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (r *Runtime) unpin() {
	for _, b := range r.pinned {
		_ = unpinPages(b) // only fails for memory that was never locked
	}
	r.pinned = nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// stagingSize is the I/O buffer: at least minBytes and one row, whole pages, plus a page at
// each end for a direct read's alignment.
func stagingSize(minBytes, rowBytes int64) int64 {
	return (max(minBytes, rowBytes)+ioAlign-1)&^(ioAlign-1) + 2*ioAlign
}

// resetCold empties the cold cache.
func (r *Runtime) resetCold() {
	for i := range r.slotKey {
		r.slotKey[i] = -1
	}
	for i := range r.where {
		r.where[i] = -1
	}
	clear(r.slotPf)
	r.free = r.free[:0]
	for s := len(r.slotKey) - 1; s >= 0; s-- {
		r.free = append(r.free, int32(s))
	}
	r.ev = newEvictor(r.cfg.evict, len(r.slotKey))
}

// Layout implements host.FFN.
func (r *Runtime) Layout() host.Layout { return r.lay }

// Load implements host.FFN: it reads every layer's hot rows into cache and empties the
// cold slots.
func (r *Runtime) Load(ctx context.Context, cache []byte) error {
	if r.closed {
		return fmt.Errorf("sparse: runtime is closed: %w", core.ErrInvalidArgument)
	}
	want := r.lay.Rows * r.rowBytes
	if int64(len(cache)) < want {
		return fmt.Errorf("sparse: cache of %d bytes, the layout needs %d: %w", len(cache), want, core.ErrInvalidArgument)
	}
	r.drain()
	r.resetCold()
	r.w.cache = cache[:want]
	b0, n0 := r.file.bytes.Load(), r.file.reads.Load()
	r.loaded = false
	total := r.coldBase * r.rowBytes
	var done int64
	chunk := (int64(len(r.w.staging[0])) - 2*ioAlign) &^ (ioAlign - 1)
	for l, h := range r.split.Hot {
		n := int64(h) * r.rowBytes
		dst := cache[r.hotBase[l]*r.rowBytes:]
		for o := int64(0); o < n; o += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := min(chunk, n-o)
			data, err := r.file.readSpan(r.w.staging[0], r.w.bases[l]+o, k)
			if err != nil {
				return fmt.Errorf("sparse: loading layer %d's hot rows: %w", l, err)
			}
			copy(dst[o:], data)
			done += k
			if r.cfg.progress != nil {
				r.cfg.progress(done, total)
			}
		}
	}
	r.mu.Lock()
	r.st.LoadBytes += r.file.bytes.Load() - b0
	r.st.loadReads += r.file.reads.Load() - n0
	r.mu.Unlock()
	r.loaded = true
	r.lastRet = time.Time{}
	return nil
}

// Stats returns a snapshot of the runtime's counters.
func (r *Runtime) Stats() RuntimeStats {
	r.mu.Lock()
	st := r.st
	r.mu.Unlock()
	st.BytesRead = r.file.bytes.Load() - st.LoadBytes
	st.Reads = r.file.reads.Load() - st.loadReads
	st.IOBusy = time.Duration(r.w.busy.Load())
	st.DirectIO = r.file.direct.Load()
	if st.active > 0 {
		st.Recall = float64(st.truePos) / float64(st.active)
	}
	if st.predicted > 0 {
		st.Precision = float64(st.truePos) / float64(st.predicted)
	}
	return st
}

// Close stops the I/O worker and closes the file; it is idempotent.
func (r *Runtime) Close() error {
	r.closeMu.Do(func() {
		r.drain()
		r.closed = true
		close(r.w.reqs)
		r.workerQ.Wait()
		r.unpin()
		if err := r.file.close(); err != nil {
			r.closeEr = fmt.Errorf("sparse: closing %s: %w", r.file.path, err)
		}
	})
	return r.closeEr
}

var _ host.FFN = (*Runtime)(nil)
