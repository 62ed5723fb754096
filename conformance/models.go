package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/xpuhub/xpu/core"
)

// ErrSkip, wrapped in a ModelCase's error, reports that the environment lacks what the case
// needs (the model file): the case is skipped, not failed.
var ErrSkip = errors.New("skipped")

// ErrMismatch, wrapped in a ModelCase's error, reports that the model's output differs from its
// expectation (category mismatch rather than error).
var ErrMismatch = errors.New("output differs from the expectation")

// ErrCapabilityLie, wrapped in a ModelCase's error, reports that the device accepted every
// node of a graph in analysis and then refused it at prepare: a failure (category
// capability-lie), never "unsupported", even when the error also wraps core.ErrUnsupported.
var ErrCapabilityLie = errors.New("the device refused what it had claimed to support")

// ModelResult is what a model case measured against its expectation.
type ModelResult struct {
	NMSE   float64 // of the logits against the reference; 0 when not measured
	MaxAbs float64
	Detail string // e.g. the generated text
}

// ModelCase is a level-5 case: a whole model run on the device under test and compared with
// its expectation (the reference backend's logits, a published sample text). Packages that
// own a model register their case in init, so the suite needs no import of them.
type ModelCase struct {
	Name string // unique, e.g. "stories260K-greedy"
	// Run executes the model on dev. It returns an error wrapping ErrSkip when a resource is
	// absent, core.ErrUnsupported when the device declined a node in analysis (op_support or
	// graph_analyze), ErrCapabilityLie when prepare refused a graph analysis had accepted (so
	// Run must analyze before it prepares to tell the two apart), and any other error for a
	// failure (a mismatch says what differed).
	Run func(ctx context.Context, dev core.Device) (ModelResult, error)
}

var models struct {
	sync.Mutex
	cases map[string]ModelCase
}

// RegisterModelCase adds a level-5 case. It returns an error for an empty or duplicate name or
// a nil Run.
func RegisterModelCase(c ModelCase) error {
	if c.Name == "" || c.Run == nil {
		return fmt.Errorf("conformance: model case needs a name and a Run: %w", core.ErrInvalidArgument)
	}
	models.Lock()
	defer models.Unlock()
	if models.cases == nil {
		models.cases = map[string]ModelCase{}
	}
	if _, dup := models.cases[c.Name]; dup {
		return fmt.Errorf("conformance: model case %q registered twice: %w", c.Name, core.ErrInvalidArgument)
	}
	models.cases[c.Name] = c
	return nil
}

func modelCases() []testCase {
	models.Lock()
	defer models.Unlock()
	names := make([]string, 0, len(models.cases))
	for n := range models.cases {
		names = append(names, n)
	}
	sort.Strings(names)
	var cs []testCase
	for _, n := range names {
		mc := models.cases[n]
		cs = append(cs, testCase{name: "MODEL(" + n + ")", level: 5, op: "MODEL", dtype: n,
			run: func(r *runner, ctx context.Context, res *CaseResult) {
				out, err := mc.Run(ctx, r.dev)
				switch {
				case errors.Is(err, ErrSkip):
					res.Status, res.Reason = StatusSkipped, err.Error()
				case errors.Is(err, ErrCapabilityLie):
					res.fail(CatCapabilityLie, "%v", err)
				case errors.Is(err, core.ErrUnsupported):
					res.Status, res.Reason = StatusUnsupported, err.Error()
				case errors.Is(err, ErrMismatch):
					res.fail(CatMismatch, "%v", err)
				case err != nil:
					res.fail(errCategory(err, false), "%v", err)
				}
				if err == nil || !errors.Is(err, ErrSkip) {
					res.NMSE, res.MaxAbs = finitePtr(out.NMSE), finitePtr(out.MaxAbs)
				}
				if out.Detail != "" && res.Reason == "" {
					res.Reason = out.Detail
				}
			}})
	}
	return cs
}

// allCases lists every case in level order.
func allCases() []testCase {
	return slices.Concat(abiCases(), opCases(), bufferCases(), graphCases(), modelCases())
}
