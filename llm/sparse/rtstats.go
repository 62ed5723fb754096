package sparse

import (
	"fmt"
	"strings"
	"time"
)

// RuntimeStats is a snapshot of a Runtime's counters (Runtime.Stats).
type RuntimeStats struct {
	// Tokens counts the token rows of layer 0's Selects; Selects counts every layer's.
	Tokens, Selects int64
	// Selected is the neuron rows selected, summed over Selects; each is a hot row (HotRows),
	// a cold row already cached (ColdHits), one read from storage (ColdMisses) or, with a
	// Bounded budget, one left out because the cold slots could not hold it (Dropped).
	Selected, HotRows, ColdHits, ColdMisses, Dropped int64
	// BytesRead and Reads are the cold reads (coalesced rows and direct I/O's alignment
	// included); LoadBytes is what Load read.
	BytesRead, Reads, LoadBytes int64
	// Predict is the host time of Select (prediction, selection, queuing the reads), Sampling
	// its recall sampling part (not in Predict); IOWait the time spent in wait; IOBusy the I/O
	// worker's reading time (overlapping compute); Compute the time between the runtime's
	// calls (the runner's graphs, and whatever the caller does between tokens).
	Predict, Sampling, IOWait, IOBusy, Compute time.Duration
	// PrefetchRows is the rows the look-ahead read (WithPrefetch), PrefetchUsed those a
	// selection then used (counted among its ColdHits), PrefetchLate the used ones still
	// loading at their Select; PrefetchPredict is the host time of the look-ahead's predictions.
	PrefetchRows, PrefetchUsed, PrefetchLate int64
	PrefetchPredict                          time.Duration
	// RecallSamples is the tokens measured by recall sampling; Recall is the share of their
	// truly active neurons that were predicted, Precision the share of the predicted ones that
	// were active (0 without samples).
	RecallSamples     int64
	Recall, Precision float64
	// The budget split: FixedBytes (FixedRegion), HotBytes (HotRowsResident rows), ColdBytes
	// (ColdSlots rows), StagingBytes (the I/O buffer). Demoted is the sidecar's hot rows the
	// budget turned cold, Promoted the rows past them that a roomier budget keeps resident.
	Budget, FixedBytes, HotBytes, ColdBytes, StagingBytes   int64
	RowBytes, HotRowsResident, ColdSlots, Demoted, Promoted int64
	Eviction                                                Eviction
	DirectIO                                                bool
	// Bounded: the budget cannot hold one whole layer's neurons besides the fixed region, so a
	// selection larger than the cache loses its least frequent neurons (Dropped).
	Bounded bool
	// PinnedBytes is the fixed region locked in memory (WithPinnedFixed); PinError says why
	// the system refused the pin ("" when it was not asked for or succeeded).
	PinnedBytes int64
	PinError    string

	truePos, predicted, active, loadReads int64
}

// HitRate is the share of selected cold rows that were cached.
func (s RuntimeStats) HitRate() float64 {
	if n := s.ColdHits + s.ColdMisses; n > 0 {
		return float64(s.ColdHits) / float64(n)
	}
	return 0
}

// BytesPerToken is the cold bytes read per token.
func (s RuntimeStats) BytesPerToken() float64 {
	if s.Tokens == 0 {
		return 0
	}
	return float64(s.BytesRead) / float64(s.Tokens)
}

// size formats bytes as MiB, or KiB below one.
func size(b int64) string {
	if b < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return mib(b)
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// String is a multi-line summary (xpu run --stats).
func (s RuntimeStats) String() string {
	var b strings.Builder
	io := "buffered"
	if s.DirectIO {
		io = "direct"
	}
	fmt.Fprintf(&b, "sparse budget %s: fixed %s, hot %s (%d rows", mib(s.Budget), mib(s.FixedBytes), mib(s.HotBytes), s.HotRowsResident)
	if s.Promoted > 0 {
		fmt.Fprintf(&b, ", %d beyond the sidecar's", s.Promoted)
	}
	if s.Demoted > 0 {
		fmt.Fprintf(&b, ", %d demoted", s.Demoted)
	}
	fmt.Fprintf(&b, "), cold %s (%d slots, %s), I/O buffer %s\n", mib(s.ColdBytes), s.ColdSlots, s.Eviction, size(s.StagingBytes))
	fmt.Fprintf(&b, "  %d tokens, %d neuron rows selected: %.1f%% hot, %.1f%% cold hits, %.1f%% misses (cold hit rate %.1f%%)\n",
		s.Tokens, s.Selected, pct(s.HotRows, s.Selected), pct(s.ColdHits, s.Selected), pct(s.ColdMisses, s.Selected), 100*s.HitRate())
	if s.Bounded {
		fmt.Fprintf(&b, "  budget below one layer's neurons: %d selected rows (%.2f%%) dropped for want of cold slots\n",
			s.Dropped, pct(s.Dropped, s.Selected))
	}
	switch {
	case s.PinnedBytes > 0:
		fmt.Fprintf(&b, "  fixed region pinned in memory: %s\n", mib(s.PinnedBytes))
	case s.PinError != "":
		fmt.Fprintf(&b, "  fixed region not pinned: %s\n", s.PinError)
	}
	fmt.Fprintf(&b, "  read %s in %d %s reads (%.1f KiB per token), loaded %s\n",
		mib(s.BytesRead), s.Reads, io, s.BytesPerToken()/1024, mib(s.LoadBytes))
	fmt.Fprintf(&b, "  host: predict %v, I/O wait %v (I/O busy %v), compute %v", s.Predict.Round(time.Microsecond),
		s.IOWait.Round(time.Microsecond), s.IOBusy.Round(time.Microsecond), s.Compute.Round(time.Microsecond))
	if s.PrefetchRows > 0 {
		fmt.Fprintf(&b, "\n  look-ahead: %d rows read, %d (%.1f%%) used (%d still loading at their Select), predict %v",
			s.PrefetchRows, s.PrefetchUsed, pct(s.PrefetchUsed, s.PrefetchRows), s.PrefetchLate, s.PrefetchPredict.Round(time.Microsecond))
	}
	if s.RecallSamples > 0 {
		fmt.Fprintf(&b, "\n  predictor: recall %.3f, precision %.3f over %d sampled tokens (sampling %v)",
			s.Recall, s.Precision, s.RecallSamples, s.Sampling.Round(time.Microsecond))
	}
	return b.String()
}
