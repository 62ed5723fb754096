package sched

import (
	"fmt"
	"math"
	"slices"

	"github.com/xpuhub/xpu/core"
)

// SplitStrategy is how one MATMUL is cut across units (HeteroLLM's tensor partitioning; the
// geometry is in SplitParts).
type SplitStrategy string

// Split strategies.
const (
	// SplitRows cuts the weight's rows N (the output's columns): every unit reads all of a.
	SplitRows SplitStrategy = "rows"
	// SplitSeq cuts a's rows M (the prompt positions): every unit reads all of the weight.
	SplitSeq SplitStrategy = "seq"
	// SplitMultiSeq runs the standard lengths a static-shape unit holds on the first unit and
	// the remainder on the second (see DecomposeSeq).
	SplitMultiSeq SplitStrategy = "multiseq"
	// SplitHybrid is rows within multiseq: each standard-length block is row-cut between the
	// two units by the ratio; the remainder runs whole on the second unit.
	SplitHybrid SplitStrategy = "hybrid"
	// SplitHeads cuts an ATTENTION's KV heads, with the query heads that read them, by the
	// ratio (op set 4's KV head range): each unit reads only its heads' slice of the KV cache.
	// It applies where q has one row (a decode step): there each part's query heads and output
	// are contiguous slices of q and of the output. A node with several query rows runs whole
	// on the rule's unit.
	SplitHeads SplitStrategy = "heads"
)

// splits says whether the strategy cuts nodes of op: heads an ATTENTION, the others a MATMUL.
func (s SplitStrategy) splits(op core.Op) bool {
	if s == SplitHeads {
		return op == core.OpAttention
	}
	return op == core.OpMatMul
}

// maxSplitUnits bounds a split's units: a merge is one CONCAT, which takes up to 8 inputs.
const maxSplitUnits = 8

// NodeSplit is a resolved split of one MATMUL node (or, SplitHeads, of one ATTENTION node),
// with runtime unit indices.
type NodeSplit struct {
	Strategy SplitStrategy
	// Units run the parts; Ratio (rows, seq, hybrid) gives each unit's share of N (rows,
	// hybrid) or M (seq); Lengths (multiseq, hybrid) are the standard lengths the first unit
	// holds.
	Units   []int
	Ratio   []float64
	Lengths []int64
	// Merge is the unit that runs an explicit merge (a CONCAT of column pieces), where one is
	// needed.
	Merge int
	// Steal makes a rows split of two units over a constant weight dynamic: the weight's
	// rows are cut into chunks prepared on both units, the first unit takes chunks from the
	// front and the second from the back, each as long as any is left, so a unit slowed down
	// (another process on its core, a cold cache, a wrong ratio) does less of the MATMUL
	// instead of making the other wait. Ratio sets where the two ends are expected to meet
	// and so the chunk sizes. With several rows of a (a prefill chunk) the chunks' column
	// bands go to a scratch slot and one CONCAT merges them, as a static rows split's parts.
	// See split_steal.go.
	Steal bool
	// Adapt makes a rows split of two units over a constant weight move its cut at run time:
	// the parts of several cut points around Ratio are prepared on both units (a backend
	// that repacks weights keeps one copy per unit: each unit prepares its widest range first
	// and the narrower ones are rows of it), and before each request chunk the runtime picks
	// the cut that balances the units by the parts' times in the chunks before, so a core
	// that runs slower for a while gets fewer rows, with one call per unit per task as for a
	// static split. One row of a only (decode); with several the split is static. See
	// split_steal.go.
	Adapt bool
}

// SplitPart is one piece of a split MATMUL's [M, N] output: rows [Row, Row+Rows) and columns
// [Col, Col+Cols), computed by Units[Unit] of the split.
type SplitPart struct {
	Unit                 int
	Row, Rows, Col, Cols int64
}

// validateSplit checks a split's shape-independent rules: the strategy, the unit count, the
// ratio (positive, finite, one per unit, summing to 1) and the standard lengths (positive,
// distinct), each present exactly where the strategy uses it.
func validateSplit(strategy SplitStrategy, units int, ratio []float64, lengths []int64) error {
	switch strategy {
	case SplitRows, SplitSeq, SplitHeads:
		if units < 2 || units > maxSplitUnits {
			return fmt.Errorf("split %s: %d units, need 2 to %d", strategy, units, maxSplitUnits)
		}
		if len(lengths) > 0 {
			return fmt.Errorf("split %s: lengths are for multiseq and hybrid", strategy)
		}
	case SplitMultiSeq, SplitHybrid:
		if units != 2 {
			return fmt.Errorf("split %s: %d units, need 2 (the static-shape unit first)", strategy, units)
		}
		if len(lengths) == 0 {
			return fmt.Errorf("split %s: no standard lengths", strategy)
		}
		for i, l := range lengths {
			if l <= 0 {
				return fmt.Errorf("split %s: standard length %d", strategy, l)
			}
			if slices.Contains(lengths[:i], l) {
				return fmt.Errorf("split %s: standard length %d listed twice", strategy, l)
			}
		}
	default:
		return fmt.Errorf("split strategy %q: want rows, seq, multiseq, hybrid or heads", strategy)
	}
	if strategy == SplitMultiSeq {
		if len(ratio) > 0 {
			return fmt.Errorf("split multiseq: no ratio (the standard lengths decide the shares)")
		}
		return nil
	}
	if len(ratio) != units {
		return fmt.Errorf("split %s: %d ratios for %d units", strategy, len(ratio), units)
	}
	sum := 0.0
	for _, r := range ratio {
		if !(r > 0) || math.IsInf(r, 0) {
			return fmt.Errorf("split %s: ratio %v: each share must be > 0", strategy, ratio)
		}
		sum += r
	}
	if math.Abs(sum-1) > 1e-6 {
		return fmt.Errorf("split %s: ratio %v sums to %g, not 1", strategy, ratio, sum)
	}
	return nil
}

// DecomposeSeq cuts m rows for a static-shape unit holding one graph per standard length:
// going through the lengths from the largest down, each length that fits in what is left is
// taken once (in that order: std are consecutive row blocks from row 0), and the rows left
// over are the remainder, which runs on a dynamic-shape unit. 300 with [256] is 256 + 44;
// 600 with [512, 32] is 512 + 32 + 56. Each length runs at most once per MATMUL: a second
// block of a small length would only move work off the unit that takes the remainder in
// parallel, which the ratio of lengths to the remainder is chosen to balance.
func DecomposeSeq[T ~int | ~int64](m T, lengths []T) (std []T, rest T) {
	ls := slices.Clone(lengths)
	slices.Sort(ls)
	slices.Reverse(ls)
	rest = m
	for _, l := range ls {
		if l > 0 && l <= rest {
			std = append(std, l)
			rest -= l
		}
	}
	return std, rest
}

// cutPoints splits n into len(ratio) consecutive counts by the cumulative ratio, each cut
// rounded to a multiple of align (so that kernels working on blocks of rows keep whole
// blocks) unless n is too small for that.
func cutPoints(n int64, ratio []float64, align int64) []int64 {
	if n < align*int64(len(ratio)) {
		align = 1
	}
	counts := make([]int64, len(ratio))
	var cum float64
	var prev int64
	for i, r := range ratio {
		cum += r
		c := n
		if i < len(ratio)-1 {
			c = int64(math.Round(float64(n)*cum/float64(align))) * align
			c = min(max(c, prev), n)
		}
		counts[i] = c - prev
		prev = c
	}
	return counts
}

// rowAlign is the multiple weight-row cuts are rounded to: whole SIMD tiles of output columns.
const rowAlign = 32

// SplitParts is the geometry of a split of an [M, N] MATMUL output, pieces with no rows or no
// columns left out:
//   - rows: all M rows; N cut by the ratio (cuts at multiples of 32 when N allows);
//   - seq: all N columns; M cut by the ratio;
//   - multiseq: DecomposeSeq's standard blocks on unit 0, the remainder on unit 1;
//   - hybrid: each standard block row-cut between unit 0 (ratio[0] of N) and unit 1; the
//     remainder whole on unit 1.
func SplitParts(strategy SplitStrategy, m, n int64, ratio []float64, lengths []int64) ([]SplitPart, error) {
	units := len(ratio)
	if strategy == SplitMultiSeq {
		units = 2
	}
	if err := validateSplit(strategy, units, ratio, lengths); err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrInvalidArgument, err)
	}
	if m < 0 || n < 0 {
		return nil, fmt.Errorf("split of a [%d, %d] output: %w", m, n, core.ErrInvalidArgument)
	}
	if strategy == SplitHeads {
		return nil, fmt.Errorf("split heads cuts an ATTENTION, not a MATMUL output: %w", core.ErrInvalidArgument)
	}
	var parts []SplitPart
	add := func(p SplitPart) {
		if p.Rows > 0 && p.Cols > 0 {
			parts = append(parts, p)
		}
	}
	switch strategy {
	case SplitRows:
		var col int64
		for u, c := range cutPoints(n, ratio, rowAlign) {
			add(SplitPart{Unit: u, Row: 0, Rows: m, Col: col, Cols: c})
			col += c
		}
	case SplitSeq:
		var row int64
		for u, r := range cutPoints(m, ratio, 1) {
			add(SplitPart{Unit: u, Row: row, Rows: r, Col: 0, Cols: n})
			row += r
		}
	case SplitMultiSeq, SplitHybrid:
		std, rest := DecomposeSeq(m, lengths)
		n0 := n
		if strategy == SplitHybrid {
			n0 = cutPoints(n, ratio, rowAlign)[0]
		}
		var row int64
		for _, s := range std {
			add(SplitPart{Unit: 0, Row: row, Rows: s, Col: 0, Cols: n0})
			add(SplitPart{Unit: 1, Row: row, Rows: s, Col: n0, Cols: n - n0})
			row += s
		}
		add(SplitPart{Unit: 1, Row: row, Rows: rest, Col: 0, Cols: n})
	}
	return parts, nil
}
