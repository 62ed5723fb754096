package conformance

import (
	_ "embed"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/core"
)

//go:embed TOLERANCES.md
var tolerancesMD string

// Threshold is one row of TOLERANCES.md: the bounds a case's outputs must stay within.
type Threshold struct {
	Op        string  `json:"op"`        // pattern the row matched on
	DType     string  `json:"dtype"`     // pattern
	Precision string  `json:"precision"` // pattern
	NMSE      float64 `json:"nmse"`
	// MaxAbs bounds max|got-ref| relative to the tensor's scale: max|got-ref| <= MaxAbs*max(1, max|ref|).
	MaxAbs float64 `json:"max_abs"`
	Reason string  `json:"reason"`
}

// Exact reports whether the row demands bit-exact values.
func (t Threshold) Exact() bool { return t.NMSE == 0 && t.MaxAbs == 0 }

// Tolerances is the parsed threshold table, in lookup order.
type Tolerances []Threshold

// DefaultTolerances returns the table embedded from TOLERANCES.md.
func DefaultTolerances() (Tolerances, error) { return ParseTolerances(tolerancesMD) }

// ParseTolerances reads the markdown table whose header is
// "| op | dtype | precision | nmse | max_abs | reason |". Other text is ignored.
func ParseTolerances(md string) (Tolerances, error) {
	var out Tolerances
	inTable := false
	for i, line := range strings.Split(md, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break // the table ended
			}
			continue
		}
		cells := splitRow(line)
		if !inTable {
			if len(cells) == 6 && strings.EqualFold(cells[0], "op") && strings.EqualFold(cells[3], "nmse") {
				inTable = true
			}
			continue
		}
		if len(cells) > 0 && strings.Trim(cells[0], "-: ") == "" {
			continue // the |---| separator
		}
		if len(cells) != 6 {
			return nil, fmt.Errorf("TOLERANCES.md line %d: %d cells, want 6", i+1, len(cells))
		}
		nmse, err := strconv.ParseFloat(cells[3], 64)
		if err != nil || nmse < 0 {
			return nil, fmt.Errorf("TOLERANCES.md line %d: nmse %q is not a number >= 0", i+1, cells[3])
		}
		maxAbs, err := strconv.ParseFloat(cells[4], 64)
		if err != nil || maxAbs < 0 {
			return nil, fmt.Errorf("TOLERANCES.md line %d: max_abs %q is not a number >= 0", i+1, cells[4])
		}
		t := Threshold{Op: cells[0], DType: cells[1], Precision: cells[2], NMSE: nmse, MaxAbs: maxAbs,
			Reason: cells[5]}
		for _, p := range []string{t.Op, t.DType, t.Precision} {
			if err := checkPatterns(p); err != nil {
				return nil, fmt.Errorf("TOLERANCES.md line %d: %w", i+1, err)
			}
		}
		if t.Reason == "" {
			return nil, fmt.Errorf("TOLERANCES.md line %d: every row needs a reason", i+1)
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("TOLERANCES.md: no threshold table found")
	}
	return out, nil
}

func splitRow(line string) []string {
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

func checkPatterns(list string) error {
	for _, p := range strings.Split(list, ",") {
		if _, err := path.Match(globSafe(strings.TrimSpace(p)), ""); err != nil {
			return fmt.Errorf("bad pattern %q: %w", p, err)
		}
	}
	return nil
}

// globSafe makes '/' an ordinary character (path.Match stops '*' at '/', but "f32/q8_0" is one
// dtype label).
func globSafe(s string) string { return strings.ReplaceAll(s, "/", "~") }

func matchAny(list, s string) bool {
	for _, p := range strings.Split(list, ",") {
		if ok, _ := path.Match(globSafe(strings.TrimSpace(p)), globSafe(s)); ok {
			return true
		}
	}
	return false
}

// Lookup returns the first row matching op, dtype label and effective precision.
func (ts Tolerances) Lookup(op, dtype, precision string) (Threshold, bool) {
	for _, t := range ts {
		if matchAny(t.Op, op) && matchAny(t.DType, dtype) && matchAny(t.Precision, precision) {
			return t, true
		}
	}
	return Threshold{}, false
}

// Check applies the row to a result's NMSE, max-abs error and reference peak (max |ref|), as
// the suite judges a case: an error naming the bound exceeded, or nil. A NaN metric fails.
func (t Threshold) Check(nmse, maxAbs, peak float64) error {
	if !(nmse <= t.NMSE) {
		return fmt.Errorf("NMSE %.3g > %.3g (TOLERANCES.md row %s | %s | %s)", nmse, t.NMSE, t.Op, t.DType, t.Precision)
	}
	if lim := t.MaxAbs * math.Max(1, peak); !(maxAbs <= lim) {
		return fmt.Errorf("max-abs %.3g > %.3g (TOLERANCES.md row %s | %s | %s)", maxAbs, lim, t.Op, t.DType, t.Precision)
	}
	return nil
}

// LowestPrecision returns the lowest of the precisions graph_analyze reported for a graph's
// nodes: the one the graph is judged by (a backend that runs one node at f16 is judged by the
// f16 rows).
func LowestPrecision(verdicts []core.NodeVerdict) core.Precision {
	prec := core.PrecDefault
	for _, v := range verdicts {
		if precisionRank(v.Precision) > precisionRank(prec) {
			prec = v.Precision
		}
	}
	return prec
}
