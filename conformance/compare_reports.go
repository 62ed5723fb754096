package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/xpuhub/xpu/core"
)

// ReadReport reads a report written by WriteJSON (<backend>.json).
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("conformance: report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("conformance: report %s: %v: %w", path, err, core.ErrInvalidArgument)
	}
	return &r, nil
}

// RegressionKind says how a case got worse between two reports.
type RegressionKind string

// Regression kinds.
const (
	RegNowFailing     RegressionKind = "now-failing"        // passed, now fails
	RegNowUnsupported RegressionKind = "now-unsupported"    // passed, now declined
	RegNewFailure     RegressionKind = "new-failure"        // a case the old report lacks, failing
	RegVanished       RegressionKind = "vanished"           // passed, absent from the new report
	RegLooserBound    RegressionKind = "tolerance-loosened" // judged by a looser threshold (or lower precision)
)

// Regression is one case that got worse.
type Regression struct {
	Case   string         `json:"case"`
	Kind   RegressionKind `json:"kind"`
	Detail string         `json:"detail"`
}

// CompareReports lists the regressions from old to new: cases that passed and now fail, are
// declined or are gone, new cases that fail, and passing cases judged by a looser threshold
// than before (a backend that now reports f16 where it reported f32 is one). Cases that got
// better are not listed. The order is by case name.
func CompareReports(old, new *Report) []Regression {
	before := map[string]CaseResult{}
	for _, c := range old.Cases {
		before[c.Name] = c
	}
	after := map[string]bool{}
	var out []Regression
	for _, c := range new.Cases {
		after[c.Name] = true
		o, had := before[c.Name]
		switch {
		case !had && c.Status == StatusFail:
			out = append(out, Regression{c.Name, RegNewFailure, failureText(c)})
		case !had:
		case o.Status == StatusPass && c.Status == StatusFail:
			out = append(out, Regression{c.Name, RegNowFailing, failureText(c)})
		case o.Status == StatusPass && c.Status == StatusUnsupported:
			out = append(out, Regression{c.Name, RegNowUnsupported, c.Reason})
		case o.Status == StatusPass && c.Status == StatusPass:
			if d := loosened(o, c); d != "" {
				out = append(out, Regression{c.Name, RegLooserBound, d})
			}
		}
	}
	for _, c := range old.Cases {
		if c.Status == StatusPass && !after[c.Name] {
			out = append(out, Regression{c.Name, RegVanished, "passed before, not in the new report"})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Case < out[j].Case })
	return out
}

func failureText(c CaseResult) string {
	if len(c.Errors) == 0 {
		return string(c.Category)
	}
	return fmt.Sprintf("[%s] %s", c.Category, c.Errors[0])
}

// loosened describes how new's threshold or precision is looser than old's ("" if not).
func loosened(old, new CaseResult) string {
	var parts []string
	if old.Precision != "" && new.Precision != "" && precisionRankOf(new.Precision) > precisionRankOf(old.Precision) {
		parts = append(parts, fmt.Sprintf("precision %s -> %s", old.Precision, new.Precision))
	}
	if old.Threshold != nil && new.Threshold != nil {
		if new.Threshold.NMSE > old.Threshold.NMSE {
			parts = append(parts, fmt.Sprintf("nmse bound %.3g -> %.3g", old.Threshold.NMSE, new.Threshold.NMSE))
		}
		if new.Threshold.MaxAbs > old.Threshold.MaxAbs {
			parts = append(parts, fmt.Sprintf("max-abs bound %.3g -> %.3g", old.Threshold.MaxAbs, new.Threshold.MaxAbs))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	s := parts[0]
	for _, p := range parts[1:] {
		s += ", " + p
	}
	return s
}

// precisionRankOf ranks a precision by its report name (precisionRank's order).
func precisionRankOf(name string) int {
	for p := core.PrecDefault; p <= core.PrecInt4; p++ {
		if p.String() == name {
			return precisionRank(p)
		}
	}
	return 0
}

// WriteRegressions prints one line per regression and a last line with the count.
func WriteRegressions(w io.Writer, regs []Regression) error {
	for _, r := range regs {
		if _, err := fmt.Fprintf(w, "REGRESSION %s: %s: %s\n", r.Kind, r.Case, r.Detail); err != nil {
			return err
		}
	}
	var err error
	if len(regs) == 0 {
		_, err = fmt.Fprintln(w, "no regressions")
	} else {
		_, err = fmt.Fprintf(w, "%d regressions\n", len(regs))
	}
	return err
}
