package sparse

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
)

// The runtime: the host half of the sparse FFN, an llm.SparseFFN over a sidecar.
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

// RuntimeOption configures NewRuntime.
type RuntimeOption func(*runtimeConfig)

type runtimeConfig struct {
	ctxLen      int
	kv          core.DType
	budget      int64
	pred        Predictor
	buffered    bool
	recallEvery int
	evict       Eviction
	thOffset    float32
	prefetch    bool
	progress    func(done, total int64)
	log         *slog.Logger
	// gapBytes: rows of one request at most this far apart in the file are read in one go
	// (reading a few unneeded rows costs less than another request on flash).
	gapBytes int64
	// stagingBytes is the minimum I/O buffer of each reader (the largest coalesced read).
	stagingBytes int64
	readers      int
	// plannedHot keeps exactly the sidecar's hot rows resident even where the budget has room
	// for more (WithPlannedHot).
	plannedHot bool
	pin        bool
}

// WithContext sizes the fixed region's KV cache like plan-sparse: ctxLen positions of kv
// values (default: min(the model's context, 4096) and F32, the runner's defaults).
func WithContext(ctxLen int, kv core.DType) RuntimeOption {
	return func(c *runtimeConfig) { c.ctxLen, c.kv = ctxLen, kv }
}

// WithBudget sets the total memory budget in bytes (0: the sidecar's budget_bytes).
func WithBudget(bytes int64) RuntimeOption { return func(c *runtimeConfig) { c.budget = bytes } }

// WithPredictor selects neurons with p on the host, from the FFN input h (e.g. an *Oracle).
// By default the sidecar's trained predictor runs in the runner's graph (the layout's
// Predictors) and Select thresholds its logits.
func WithPredictor(p Predictor) RuntimeOption { return func(c *runtimeConfig) { c.pred = p } }

// WithBufferedIO reads through the page cache (no O_DIRECT).
func WithBufferedIO() RuntimeOption { return func(c *runtimeConfig) { c.buffered = true } }

// WithRecallSampling measures the predictor on every Nth Select (one layer of one chunk): each
// token's predicted neurons against its truly active ones (gate row · h > 0, from the mapped
// sidecar's gate rows one at a time). It costs F·D multiply-adds per token and sample.
func WithRecallSampling(every int) RuntimeOption {
	return func(c *runtimeConfig) { c.recallEvery = every }
}

// WithEviction sets the cold cache's replacement policy (default EvictLRU).
func WithEviction(p Eviction) RuntimeOption { return func(c *runtimeConfig) { c.evict = p } }

// WithThresholdOffset raises (or, negative, lowers) the trained predictor's threshold by delta
// in logit units: a neuron is selected when its logit exceeds the sidecar's threshold + delta.
// A positive delta reads fewer cold bundles per token (the sidecar's threshold is set for high
// recall, so most of what it selects turns out inactive) at the cost of recall; measure the
// cost with xpu sparse-eval. It does not apply to a host predictor (WithPredictor).
func WithThresholdOffset(delta float32) RuntimeOption {
	return func(c *runtimeConfig) { c.thOffset = delta }
}

// WithPrefetch turns the look-ahead on or off (default on). With it, a one-token Select of
// layer l also predicts layer l+1's neurons from layer l's FFN input (the trained predictor of
// layer l+1 on the host: the residual stream changes little from one layer to the next, so
// this finds almost all of them) and queues their reads behind layer l's: they load while the
// runner computes the rest of layer l and layer l+1's attention, instead of after layer l+1's
// Select. The next Select lists those still in flight in later, so nothing waits for them
// before it must. It applies to the trained predictor (no WithPredictor) only.
func WithPrefetch(on bool) RuntimeOption { return func(c *runtimeConfig) { c.prefetch = on } }

// WithLoadProgress has Load report bytes of hot rows read so far and in all.
func WithLoadProgress(fn func(done, total int64)) RuntimeOption {
	return func(c *runtimeConfig) { c.progress = fn }
}

// WithLogger logs the runtime's decisions at debug level (it logs nothing above).
func WithLogger(l *slog.Logger) RuntimeOption { return func(c *runtimeConfig) { c.log = l } }

// WithReaders sets how many cold reads are in flight at once (default 16, each with its own
// I/O buffer in the budget; flash serves deep queues fastest: the 7B bench waited 1.2–1.6x
// less for its misses with 16 than with 4); 1 reads one span at a time.
func WithReaders(n int) RuntimeOption { return func(c *runtimeConfig) { c.readers = n } }

// WithPlannedHot keeps exactly the sidecar's hot rows resident (fewer where the budget is
// short). By default a budget with room to spare keeps more rows resident, the most frequent
// first, down to every neuron when it holds them all (then nothing is read per token).
func WithPlannedHot() RuntimeOption { return func(c *runtimeConfig) { c.plannedHot = true } }

// WithPinnedFixed locks the fixed region's weights (every non-FFN tensor of the model's file
// mapping) in memory while the runtime is open (mlock), so that a memory limit evicts cold
// neurons, which the runtime reads in large direct requests, rather than attention weights,
// which a backend reads from the mapping page by page at every layer. The budget already
// counts them. Pin only when the backend computes from the mapping (neon with repack=0): a
// backend that copies the weights at prepare makes the pinned pages a second copy. A pin the
// system refuses (RLIMIT_MEMLOCK, no CAP_IPC_LOCK) is not an error: RuntimeStats.PinError says
// why and decoding goes on unpinned.
func WithPinnedFixed(on bool) RuntimeOption { return func(c *runtimeConfig) { c.pin = on } }

// WithCoalesceGap sets how far apart (bytes in the sidecar) two missing rows of one layer may
// be and still be read in one request, the rows between them read and thrown away (default
// 32 KiB). A larger gap means fewer, larger requests, which flash serves faster per byte, for
// more bytes; 0 reads only adjacent rows together.
func WithCoalesceGap(bytes int64) RuntimeOption {
	return func(c *runtimeConfig) { c.gapBytes = bytes }
}

// withIO tunes coalescing and the staging buffer (tests and benchmarks).
func withIO(gapBytes, stagingBytes int64) RuntimeOption {
	return func(c *runtimeConfig) { c.gapBytes, c.stagingBytes = gapBytes, stagingBytes }
}

// Runtime is the sparse FFN's host half over a sidecar: it implements llm.SparseFFN. Layout,
// Load, Select and the wait functions are called by one goroutine (the runner's); Stats may be
// called from any goroutine.
type Runtime struct {
	cfg      runtimeConfig
	sc       *Sidecar
	L, F, D  int
	rowBytes int64
	lay      llm.SparseLayout
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
	r.lay = llm.SparseLayout{DType: sc.BundleType, RowLen: int64(BundleWidth(sc.D, sc.Gated)), Neurons: sc.F, Act: act, Ungated: !sc.Gated}
	r.threshold = sc.PredThreshold + cfg.thOffset
	if cfg.pred != nil {
		r.host = cfg.pred
	} else {
		// The graphs take the sidecar's F16 predictors as they are mapped: no copy on the heap.
		for _, ly := range sc.layers {
			r.lay.Predictors = append(r.lay.Predictors, llm.SparsePredictor{Rank: sc.PredRank,
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

// Layout implements llm.SparseFFN.
func (r *Runtime) Layout() llm.SparseLayout { return r.lay }

// Load implements llm.SparseFFN: it reads every layer's hot rows into cache and empties the
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

// Select implements llm.SparseFFN. The returned wait stays valid until the next Select.
func (r *Runtime) Select(ctx context.Context, l int, h, logits, next []float32, now, later []int32) (func() error, error) {
	t0 := time.Now()
	F, D := r.F, r.D
	switch {
	case r.closed || !r.loaded:
		return nil, fmt.Errorf("sparse: Select before Load or after Close: %w", core.ErrInvalidArgument)
	case l < 0 || l >= r.L:
		return nil, fmt.Errorf("sparse: layer %d of %d: %w", l, r.L, core.ErrInvalidArgument)
	case len(h) == 0 || len(h)%D != 0 || len(now) != F || len(later) != F:
		return nil, fmt.Errorf("sparse: Select with %d values of h (dim %d), %d/%d index slots (%d neurons): %w",
			len(h), D, len(now), len(later), F, core.ErrInvalidArgument)
	case logits != nil && len(logits) != len(h)/D*F, next != nil && len(next) != len(h)/D*F:
		return nil, fmt.Errorf("sparse: %d logits (%d of the next layer) for %d tokens of %d neurons: %w", len(logits), len(next), len(h)/D, F, core.ErrInvalidArgument)
	}
	r.settle(l)
	if r.reqErr != nil {
		r.cfg.log.Debug("sparse: the last Select's reads failed and nobody waited for them", "err", r.reqErr)
		r.reqErr = nil
	}
	compute := time.Duration(0)
	if !r.lastRet.IsZero() {
		compute = t0.Sub(r.lastRet)
	}
	if r.host != nil {
		logits = nil // a host predictor decides from h alone
	}
	r.epoch++
	if r.epoch == 0 { // wrapped: marks of 2³² selections ago would read as current
		clear(r.mark)
		r.epoch = 1
	}
	sample := r.cfg.recallEvery > 0 && r.selects%int64(r.cfg.recallEvery) == 0
	r.selects++
	var sampling time.Duration
	var tp, npred, ntrue int64
	c := len(h) / D
	active := r.active[:0]
	for t := range c {
		x := h[t*D : (t+1)*D]
		if logits != nil {
			for i, v := range logits[t*F : (t+1)*F] {
				if v > r.threshold {
					if r.mark[i] != r.epoch {
						r.mark[i] = r.epoch
						active = append(active, int32(i))
					}
					if sample {
						r.predMark[i] = true
					}
				}
			}
		} else {
			if r.host != nil {
				r.predBuf = r.host.Predict(l, x, r.predBuf[:0])
			} else {
				r.predBuf = r.hostTrained().Predict(l, x, r.predBuf[:0])
			}
			for _, i := range r.predBuf {
				if i < 0 || int(i) >= F {
					r.active = active
					if sample {
						clear(r.predMark)
					}
					return nil, fmt.Errorf("sparse: predictor gave neuron %d of layer %d (%d neurons): %w", i, l, F, core.ErrInvalidArgument)
				}
				if r.mark[i] != r.epoch {
					r.mark[i] = r.epoch
					active = append(active, i)
				}
				if sample {
					r.predMark[i] = true
				}
			}
		}
		if sample {
			ts := time.Now()
			a, b, d := r.measure(l, x)
			tp, npred, ntrue = tp+a, npred+b, ntrue+d
			sampling += time.Since(ts)
		}
	}
	r.active = active
	slices.Sort(active)

	// Hot rows and hits first, pinning the hit slots so no miss evicts them.
	// A hit whose prefetch is still in flight goes to later.
	hot := int32(r.split.Hot[l])
	nNow, nHot, nLater, pfUsed, pfLate := 0, 0, 0, 0, 0
	misses := r.missRow[:0]
	hits := r.hits[:0]
	base := int32(l * F)
	for _, i := range active {
		if i < hot {
			now[nNow] = int32(r.hotBase[l]) + i
			nNow++
			nHot++
			continue
		}
		if s := r.where[base+i]; s >= 0 {
			if r.slotPf[s] {
				r.slotPf[s] = false
				pfUsed++
			}
			if r.slotSeq[s] <= r.completed {
				now[nNow] = int32(r.coldBase) + s
				nNow++
			} else {
				later[nLater] = int32(r.coldBase) + s
				nLater++
				pfLate++
			}
			r.ev.remove(s)
			hits = append(hits, s)
			continue
		}
		misses = append(misses, i)
	}
	// A bounded budget's cold slots may not hold the whole selection: the least frequent of its
	// misses (the highest bundle rows) are dropped.
	dropped := 0
	if room := len(r.slotKey) - len(hits); len(misses) > room {
		dropped = len(misses) - room
		misses = misses[:room]
	}
	req := &r.reqs[(r.issued+1)%int64(len(r.reqs))]
	rows := req.rows[:0]
	for _, i := range misses {
		var s int32
		if n := len(r.free); n > 0 {
			s, r.free = r.free[n-1], r.free[:n-1]
		} else if s = r.ev.victim(); s < 0 {
			// splitBudget sizes the slots for any one layer's selection: unreachable. Undo
			// the assignments so no slot claims a neuron it does not hold.
			for _, hs := range hits {
				r.ev.push(hs, true)
			}
			for _, rw := range rows {
				s := int32(uint32(rw))
				r.where[r.slotKey[s]], r.slotKey[s] = -1, -1
				r.free = append(r.free, s)
			}
			req.rows = rows[:0]
			return nil, fmt.Errorf("sparse: layer %d: no cold slot left for %d misses: %w", l, len(misses), core.ErrInternal)
		}
		if old := r.slotKey[s]; old >= 0 {
			r.where[old] = -1
		}
		r.slotKey[s], r.where[base+i] = base+i, s
		r.slotSeq[s], r.slotPf[s] = r.issued+1, false
		later[nLater] = int32(r.coldBase) + s
		nLater++
		rows = append(rows, uint64(i)<<32|uint64(s))
	}
	req.rows = rows
	if len(rows) > 0 {
		// Reads start now, while the runner computes now's rows.
		r.queue(ctx, req, l, false)
	}
	r.needSeq = r.issued
	// The look-ahead, before this selection's slots go back to the evictor (so it cannot take
	// them).
	var sp time.Duration
	pfRows := 0
	if r.pfLog != nil && c == 1 && l+1 < r.L {
		ts := time.Now()
		pfRows = r.prefetch(ctx, l+1, h, next)
		sp = time.Since(ts)
	}
	for _, s := range hits {
		r.ev.push(s, true)
	}
	for _, rw := range rows {
		r.ev.push(int32(uint32(rw)), false)
	}
	r.hits, r.missRow = hits, misses
	for k := nNow; k < F; k++ {
		now[k] = -1
	}
	for k := nLater; k < F; k++ {
		later[k] = -1
	}
	end := time.Now()
	r.mu.Lock()
	st := &r.st
	if l == 0 {
		st.Tokens += int64(c)
	}
	st.Selects++
	st.Selected += int64(len(active))
	st.HotRows += int64(nHot)
	st.ColdHits += int64(len(hits))
	st.ColdMisses += int64(len(rows))
	st.Dropped += int64(dropped)
	st.Predict += end.Sub(t0) - sampling - sp
	st.PrefetchPredict += sp
	st.PrefetchRows += int64(pfRows)
	st.PrefetchUsed += int64(pfUsed)
	st.PrefetchLate += int64(pfLate)
	st.Sampling += sampling
	st.Compute += compute
	if sample {
		st.RecallSamples += int64(c)
		st.truePos += tp
		st.predicted += npred
		st.active += ntrue
	}
	r.mu.Unlock()
	r.lastRet = end
	return r.waitFn, nil
}

// measure compares the predicted neurons of one token (predMark, cleared here) with its truly
// active ones: gate row · x > 0, each gate row decoded from the mapped sidecar on its own.
func (r *Runtime) measure(l int, x []float32) (tp, pred, truth int64) {
	b := r.sc.Bundle(l)
	seg := r.sc.BundleType.Bytes(int64(r.D))
	for i := 0; i < r.F; i++ {
		g := r.gateRow
		raw := b[int64(i)*r.rowBytes:][:seg]
		switch r.sc.BundleType {
		case core.F32:
			g = core.DecodeF32To(g, raw)
		case core.F16:
			for j := range g {
				g[j] = core.F16ToF32(binary.LittleEndian.Uint16(raw[2*j:]))
			}
		default:
			if xs, err := core.Dequantize(r.sc.BundleType, raw, 0); err == nil {
				g = xs
			}
		}
		on := dot(g, x) > 0
		p := r.predMark[i]
		r.predMark[i] = false
		switch {
		case on && p:
			tp, pred, truth = tp+1, pred+1, truth+1
		case on:
			truth++
		case p:
			pred++
		}
	}
	return tp, pred, truth
}

// queue sends req (rows sorted by file offset, slots already assigned) to the I/O worker.
func (r *Runtime) queue(ctx context.Context, req *ioReq, l int, prefetch bool) {
	r.issued++
	req.ctx, req.layer, req.seq, req.prefetch = ctx, l, r.issued, prefetch
	r.inflight = append(r.inflight, req)
	r.w.reqs <- req
}

// hostTrained is the sidecar's predictor decoded for the host, made on first use: the runner
// computes the logits in its graphs, so most runtimes never need it.
func (r *Runtime) hostTrained() *Trained {
	if r.trained == nil {
		r.trained = r.sc.Predictor()
		r.trained.Threshold = r.threshold
	}
	return r.trained
}

// prefetch predicts layer l's neurons from x (the previous layer's FFN input), or takes the
// runner's logits of that prediction (next), and queues the reads of those neither hot nor
// cached, into free slots or the evictor's victims (the selection in progress is out of its
// reach). It returns the rows queued.
func (r *Runtime) prefetch(ctx context.Context, l int, x, next []float32) int {
	lg := next
	if lg == nil {
		r.pfLog = r.hostTrained().Logits(l, x, r.pfLog)
		lg = r.pfLog
	}
	hot := r.split.Hot[l]
	base := int32(l * r.F)
	req := &r.reqs[(r.issued+1)%int64(len(r.reqs))]
	rows := req.rows[:0]
	for i, v := range lg {
		if v <= r.threshold || i < hot || r.where[base+int32(i)] >= 0 {
			continue
		}
		var s int32
		if n := len(r.free); n > 0 {
			s, r.free = r.free[n-1], r.free[:n-1]
		} else if s = r.ev.victim(); s < 0 {
			break
		}
		if old := r.slotKey[s]; old >= 0 {
			r.where[old] = -1
		}
		r.slotKey[s], r.where[base+int32(i)] = base+int32(i), s
		r.slotSeq[s], r.slotPf[s] = r.issued+1, true
		rows = append(rows, uint64(i)<<32|uint64(uint32(s)))
	}
	req.rows = rows
	if len(rows) > 0 {
		r.queue(ctx, req, l, true)
	}
	for _, rw := range rows {
		r.ev.push(int32(uint32(rw)), false)
	}
	return len(rows)
}

// complete takes the oldest request's result (blocking until the worker sends it); a failed
// request leaves its slots empty (their bytes are not the neurons they were meant to hold),
// but for those a later request took over.
func (r *Runtime) complete() {
	err := <-r.w.done
	req := r.inflight[0]
	r.inflight = append(r.inflight[:0], r.inflight[1:]...)
	r.completed = req.seq
	if err == nil {
		return
	}
	for _, rw := range req.rows {
		s := int32(uint32(rw))
		if r.slotSeq[s] != req.seq {
			continue
		}
		if k := r.slotKey[s]; k >= 0 {
			r.where[k] = -1
		}
		r.slotKey[s], r.slotPf[s] = -1, false
		r.ev.remove(s)
		r.free = append(r.free, s)
	}
	r.reqErr = errors.Join(r.reqErr, err)
}

// drain completes every request in flight.
func (r *Runtime) drain() {
	for len(r.inflight) > 0 {
		r.complete()
	}
}

// settle, at the start of layer l's Select, completes every request in flight but a prefetch
// of layer l (which Select lists as later where it is still loading), then takes whatever the
// worker has finished since.
func (r *Runtime) settle(l int) {
	for n := len(r.inflight); n > 0; n = len(r.inflight) {
		if q := r.inflight[n-1]; n == 1 && q.prefetch && q.layer == l {
			break
		}
		r.complete()
	}
	for len(r.inflight) > 0 && len(r.w.done) > 0 {
		r.complete()
	}
}

// wait is what Select returns: it blocks until the last Select's lists are in the cache (its
// misses, and the prefetched rows it found still loading; not the next layer's prefetch).
func (r *Runtime) wait() error {
	t0 := time.Now()
	for r.completed < r.needSeq {
		r.complete()
	}
	end := time.Now()
	r.mu.Lock()
	if !r.lastRet.IsZero() {
		r.st.Compute += t0.Sub(r.lastRet)
	}
	r.st.IOWait += end.Sub(t0)
	r.mu.Unlock()
	r.lastRet = end
	err := r.reqErr
	r.reqErr = nil
	return err
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

var _ llm.SparseFFN = (*Runtime)(nil)
