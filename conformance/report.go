package conformance

import (
	"fmt"
	"time"

	"github.com/xpuhub/xpu/core"
)

// Status is a case's outcome.
type Status string

// Outcomes. Unsupported (the backend declined before prepare) is not a failure; Skipped means
// the environment lacks something the case needs (a model file).
const (
	StatusPass        Status = "pass"
	StatusFail        Status = "fail"
	StatusUnsupported Status = "unsupported"
	StatusSkipped     Status = "skipped"
)

// Category says why a case failed.
type Category string

// Failure categories, most severe first.
const (
	CatNone             Category = ""
	CatTimeout          Category = "timeout"          // a call did not return in time (an isolated backend is killed)
	CatCrash            Category = "crash"            // the backend process died
	CatCapabilityLie    Category = "capability-lie"   // claimed support, then refused at prepare or execute
	CatError            Category = "error"            // an unexpected error status, or a missing expected one
	CatOutOfBounds      Category = "out-of-bounds"    // a byte outside the output (or inside an input) changed
	CatNaN              Category = "nan"              // NaN or Inf where the reference is finite
	CatMismatch         Category = "mismatch"         // over the NMSE or max-abs threshold
	CatNondeterministic Category = "nondeterministic" // two runs gave different bytes
)

var severity = map[Category]int{CatTimeout: 8, CatCrash: 7, CatCapabilityLie: 6, CatError: 5, CatOutOfBounds: 4,
	CatNaN: 3, CatMismatch: 2, CatNondeterministic: 1}

// CaseResult is one case's record in the reports.
type CaseResult struct {
	Name      string   `json:"name"`
	Level     int      `json:"level"`
	Op        string   `json:"op"`
	DType     string   `json:"dtype"`
	Status    Status   `json:"status"`
	Category  Category `json:"category,omitempty"`
	Errors    []string `json:"errors,omitempty"`
	Reason    string   `json:"reason,omitempty"` // why unsupported or skipped
	Precision string   `json:"precision,omitempty"`
	// NMSE and MaxAbs are the worst over the case's outputs; nil when nothing was compared.
	NMSE      *float64   `json:"nmse,omitempty"`
	MaxAbs    *float64   `json:"max_abs,omitempty"`
	Threshold *Threshold `json:"threshold,omitempty"`
	Seconds   float64    `json:"seconds"`
	Repro     string     `json:"repro,omitempty"` // the command that reruns just this case
}

// fail records a failure; the most severe category wins.
func (r *CaseResult) fail(cat Category, format string, args ...any) {
	r.Status = StatusFail
	if severity[cat] > severity[r.Category] {
		r.Category = cat
	}
	msg := fmt.Sprintf(format, args...)
	for _, e := range r.Errors {
		if e == msg {
			return // the second run of a case repeats the first one's findings
		}
	}
	r.Errors = append(r.Errors, msg)
}

// BackendRecord identifies the plugin a report is about.
type BackendRecord struct {
	Name       string `json:"name"`
	Vendor     string `json:"vendor"`
	Version    string `json:"version"`
	BuildID    string `json:"build_id"`
	SDKVersion string `json:"sdk_version,omitempty"`
	Path       string `json:"path,omitempty"`
	Isolated   bool   `json:"isolated,omitempty"`
}

// DeviceRecord identifies the device a report is about.
type DeviceRecord struct {
	Index        int      `json:"index"`
	Kind         string   `json:"kind"`
	Name         string   `json:"name"`
	Vendor       string   `json:"vendor"`
	Driver       string   `json:"driver,omitempty"`
	Caps         []string `json:"caps"`
	MemoryBytes  uint64   `json:"memory_bytes,omitempty"`
	ComputeUnits int      `json:"compute_units,omitempty"`
}

func backendRecord(i core.BackendInfo) BackendRecord {
	return BackendRecord{Name: i.Name, Vendor: i.Vendor, Version: i.Version, BuildID: i.BuildID,
		SDKVersion: i.SDKVersion, Path: i.Path, Isolated: i.Isolated}
}

func deviceRecord(d core.DeviceInfo) DeviceRecord {
	return DeviceRecord{Index: d.Index, Kind: d.Kind.String(), Name: d.Name, Vendor: d.Vendor, Driver: d.Driver,
		Caps: d.Caps.Names(), MemoryBytes: d.MemoryBytes, ComputeUnits: d.ComputeUnits}
}

// Report is the result of one Run.
type Report struct {
	Backend     BackendRecord `json:"backend"`
	Device      DeviceRecord  `json:"device"`
	Provenance  Provenance    `json:"provenance"`
	Seed        uint64        `json:"seed"`
	Started     time.Time     `json:"started"`
	Seconds     float64       `json:"seconds"`
	Passed      int           `json:"passed"`
	Failed      int           `json:"failed"`
	Unsupported int           `json:"unsupported"`
	Skipped     int           `json:"skipped"`
	// Levels: which of the levels a vendor can claim this run supports, and why (ClaimLevels).
	Levels []LevelResult `json:"levels,omitempty"`
	Cases  []CaseResult  `json:"cases"`
}

func (r *Report) add(c CaseResult) {
	switch c.Status {
	case StatusPass:
		r.Passed++
	case StatusFail:
		r.Failed++
	case StatusUnsupported:
		r.Unsupported++
	case StatusSkipped:
		r.Skipped++
	}
	r.Cases = append(r.Cases, c)
}

// Summary is the line the CLI prints last.
func (r *Report) Summary() string {
	return fmt.Sprintf("%d passed, %d failed, %d unsupported", r.Passed, r.Failed, r.Unsupported)
}

// Failures returns the failed cases.
func (r *Report) Failures() []CaseResult {
	var out []CaseResult
	for _, c := range r.Cases {
		if c.Status == StatusFail {
			out = append(out, c)
		}
	}
	return out
}

// Case finds a case result by name.
func (r *Report) Case(name string) (CaseResult, bool) {
	for _, c := range r.Cases {
		if c.Name == name {
			return c, true
		}
	}
	return CaseResult{}, false
}
