package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"time"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
)

// caseTimeout bounds one case, so a backend that hangs fails the case instead of the run (the
// slowest case takes about a second on a loaded CI machine).
const caseTimeout = time.Minute

// restartTimeout bounds bringing a crashed isolated backend back.
const restartTimeout = 30 * time.Second

// testCase is one named check. run fills res (status pass unless it records a failure).
type testCase struct {
	name  string
	level int
	op    string // tolerance key: op name or GRAPH:<name>
	dtype string // tolerance key: dtype label
	// v5: the case uses an op set 5 addition that no op set 4 graph has (an attention
	// soft-cap or sliding window); the LLM core level does not rest on it.
	v5  bool
	run func(r *runner, ctx context.Context, res *CaseResult)
}

// runner holds what every case of one Run shares.
type runner struct {
	cfg    config
	b      core.Backend
	dev    core.Device
	plugin *abi.Plugin
	cctx   core.Context
	ctxErr error
	down   error // set when the backend crashed and could not be brought back
	hung   error // set when a call timed out: the backend's remaining cases are skipped

	// level 1 run elsewhere (WithABIRunner): its results, by name, fetched on first use
	abiRan     bool
	abiErr     error
	abiShown   bool
	abiResults map[string]CaseResult
	abiOrder   []string
}

// Run puts backend b through the conformance suite and returns its report (and writes the
// report files when WithReportDir is given). An error means the suite could not run at all
// (no such device, reports not writable); failing cases are in the report.
func Run(ctx context.Context, b core.Backend, opts ...Option) (*Report, error) {
	cfg := newConfig(opts)
	if b == nil {
		return nil, fmt.Errorf("conformance: nil backend: %w", core.ErrInvalidArgument)
	}
	if cfg.tolerances == nil {
		t, err := DefaultTolerances()
		if err != nil {
			return nil, fmt.Errorf("conformance: %w", err)
		}
		cfg.tolerances = t
	}
	devs := b.Devices()
	if cfg.device < 0 || cfg.device >= len(devs) {
		return nil, fmt.Errorf("conformance: %s has %d device(s), no device %d: %w", b.Info().Name,
			len(devs), cfg.device, core.ErrNotFound)
	}
	r := &runner{cfg: cfg, b: b, dev: devs[cfg.device], plugin: cfg.plugin}
	if r.plugin == nil {
		r.plugin = abi.PluginOf(b)
	}
	if r.cfg.repro == "" {
		target := b.Info().Path
		if target == "" {
			target = b.Info().Name
		}
		r.cfg.repro = "xpu conform --plugin " + target
		if cfg.device != 0 {
			r.cfg.repro += fmt.Sprintf(" --device %d", cfg.device)
		}
	}
	rep := &Report{Backend: backendRecord(b.Info()), Device: deviceRecord(r.dev.Info()), Seed: cfg.seed, Started: time.Now().UTC(),
		Provenance: provenance(cfg, r.plugin)}
	if cfg.reportDir != "" {
		if err := rep.RemoveFiles(cfg.reportDir); err != nil {
			return nil, err
		}
	}
	cases := allCases()
	for _, tc := range cases {
		if cfg.levels != nil && !cfg.levels[tc.level] {
			continue
		}
		if cfg.filter != nil && !cfg.filter.MatchString(tc.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("conformance: %w", err)
		}
		var res CaseResult
		if tc.level == 1 && r.plugin == nil && cfg.abiRunner != nil {
			res = r.abiCase(ctx, tc)
		} else {
			res = r.runCase(ctx, tc)
		}
		rep.add(res)
		progress(cfg.progress, res)
	}
	// what the level-1 run reported beyond the suite's cases (its end-of-run checks)
	for _, name := range r.abiOrder {
		if slices.ContainsFunc(cases, func(tc testCase) bool { return tc.name == name }) {
			continue // a case this run's filter left out
		}
		res := r.abiResults[name]
		rep.add(res)
		progress(cfg.progress, res)
	}
	if r.cctx != nil {
		if err := r.cctx.Close(); err != nil {
			// a whole-run check: it reruns with the run's own filter, and is printed like a case
			repro := r.cfg.repro
			if cfg.filter != nil {
				repro += " --filter '" + cfg.filter.String() + "'"
			}
			res := CaseResult{Name: "ABI(context-close-at-end)", Level: 1, Op: "ABI", Status: StatusFail,
				Category: CatError, Errors: []string{fmt.Sprintf("closing the suite's context: %v", err)},
				Repro: fmt.Sprintf("%s --seed %d", repro, cfg.seed)}
			rep.add(res)
			progress(cfg.progress, res)
		}
	}
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.Levels = ClaimLevels(rep.Cases)
	if cfg.reportDir != "" {
		if err := rep.WriteFiles(cfg.reportDir); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

func (r *runner) runCase(ctx context.Context, tc testCase) (res CaseResult) {
	res = CaseResult{Name: tc.name, Level: tc.level, Op: tc.op, DType: tc.dtype, Status: StatusPass}
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			res.fail(CatError, "the suite panicked: %v", p)
		}
		res.Seconds = time.Since(start).Seconds()
		if res.Status == StatusFail {
			res.Repro = fmt.Sprintf("%s --filter '^%s$' --seed %d", r.cfg.repro, regexp.QuoteMeta(tc.name),
				r.cfg.seed)
		}
	}()
	if r.hung != nil {
		// one failure says it: a backend that hangs would cost every later case its timeout
		res.Status, res.Reason = StatusSkipped, fmt.Sprintf("not run: %v", r.hung)
		return res
	}
	if r.down != nil {
		res.fail(CatCrash, "not run: %v", r.down)
		return res
	}
	caseCtx, cancel := context.WithTimeout(ctx, caseTimeout)
	defer cancel()
	tc.run(r, caseCtx, &res)
	switch res.Category {
	case CatTimeout:
		r.hung = fmt.Errorf("the backend timed out in %s", tc.name)
		res.fail(CatTimeout, "the backend's remaining cases are skipped (a hung backend would cost each its timeout)")
		r.recoverFromCrash(ctx, tc.name)
	case CatCrash:
		r.recoverFromCrash(ctx, tc.name)
	}
	return res
}

// abiCase is a level-1 case of a backend not loaded in this process: its result from the
// WithABIRunner run, which runs once, on the first such case.
func (r *runner) abiCase(ctx context.Context, tc testCase) CaseResult {
	if !r.abiRan {
		r.abiRan = true
		results, err := r.cfg.abiRunner(ctx)
		r.abiErr = err
		r.abiResults = map[string]CaseResult{}
		for _, c := range results {
			if _, dup := r.abiResults[c.Name]; !dup {
				r.abiOrder = append(r.abiOrder, c.Name)
			}
			r.abiResults[c.Name] = c
		}
	}
	res := CaseResult{Name: tc.name, Level: tc.level, Op: tc.op, DType: tc.dtype, Status: StatusPass}
	if c, ok := r.abiResults[tc.name]; ok {
		delete(r.abiResults, tc.name)
		r.abiOrder = slices.DeleteFunc(r.abiOrder, func(n string) bool { return n == tc.name })
		return c
	}
	switch {
	case r.abiErr != nil && !r.abiShown:
		r.abiShown = true
		res.fail(CatCrash, "the level-1 run in a process of its own failed: %v", r.abiErr)
	case r.abiErr != nil:
		res.Status, res.Reason = StatusSkipped, "not run: the level-1 run failed (see the first ABI case)"
	default:
		res.fail(CatError, "the level-1 run in a process of its own did not report this case")
	}
	res.Repro = fmt.Sprintf("%s --filter '^%s$' --seed %d", r.cfg.repro, regexp.QuoteMeta(tc.name), r.cfg.seed)
	return res
}

// recoverFromCrash drops the dead context and restarts an isolated backend's child process,
// so the cases after a crash still run. When the backend cannot come back, every later case
// fails as not run rather than looking unsupported.
func (r *runner) recoverFromCrash(ctx context.Context, name string) {
	r.cctx, r.ctxErr = nil, nil
	rs, ok := r.b.(interface{ Restart(context.Context) error })
	if !ok {
		r.down = fmt.Errorf("the backend crashed in %s and cannot be restarted", name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, restartTimeout)
	defer cancel()
	if err := rs.Restart(ctx); err != nil {
		r.down = fmt.Errorf("the backend crashed in %s and its restart failed: %w", name, err)
	}
}
func progress(w io.Writer, res CaseResult) {
	if w == nil {
		return
	}
	switch res.Status {
	case StatusPass:
		if res.NMSE != nil && res.Threshold != nil {
			fmt.Fprintf(w, "  %s: OK  nmse=%.2g <= %.2g\n", res.Name, *res.NMSE, res.Threshold.NMSE)
		} else {
			fmt.Fprintf(w, "  %s: OK\n", res.Name)
		}
	case StatusUnsupported, StatusSkipped:
		fmt.Fprintf(w, "  %s: %s [%s]\n", res.Name, res.Status, res.Reason)
	default:
		fmt.Fprintf(w, "  %s: FAIL [%s]\n", res.Name, res.Category)
		for _, e := range res.Errors {
			fmt.Fprintf(w, "      %s\n", e)
		}
		fmt.Fprintf(w, "      rerun: %s\n", res.Repro)
	}
}

// context is the suite's one context on the device, made on first use.
func (r *runner) context(ctx context.Context) (core.Context, error) {
	if r.cctx == nil && r.ctxErr == nil {
		r.cctx, r.ctxErr = r.dev.NewContext(ctx, nil)
	}
	return r.cctx, r.ctxErr
}

// errCategory classifies a backend error. claimed: the backend had said it supports the case,
// so an "unsupported" answer now is a capability lie.
func errCategory(err error, claimed bool) Category {
	switch {
	case errors.Is(err, core.ErrTimeout):
		return CatTimeout
	case errors.Is(err, core.ErrBackendCrashed):
		return CatCrash
	case claimed && (errors.Is(err, core.ErrUnsupported) || errors.Is(err, core.ErrIncompatible)):
		return CatCapabilityLie
	}
	return CatError
}

// precisionRank orders precisions from widest (0) to narrowest.
func precisionRank(p core.Precision) int {
	switch p {
	case core.PrecF16:
		return 1
	case core.PrecBF16:
		return 2
	case core.PrecInt8:
		return 3
	case core.PrecInt4:
		return 4
	}
	return 0
}
