package sparse

import (
	"log/slog"

	"github.com/xpuhub/xpu/core"
)

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
