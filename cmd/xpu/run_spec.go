package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/llm/spec"
)

// specFlags are run's speculative-decoding flags.
type specFlags struct {
	mode    *string
	lengths *string
	task    *string
	always  *bool
	stats   *bool
}

// addSpecFlags adds the flags to fs; stats is run's --stats, which also prints the speculative
// decoding statistics.
func addSpecFlags(fs *flag.FlagSet, stats *bool) *specFlags {
	return &specFlags{
		mode: fs.String("spec", "auto", "speculative decoding: retrieval (drafts from the prompt, the output so far, the model's prefill predictions and earlier answers), "+
			"lookup (prompt-lookup n-grams), off, or auto: retrieval when greedy (--temp 0), off when sampling (so that a seed repeats its text); "+
			"drafts are verified only while they pay, and the output is plain decoding's"),
		lengths: fs.String("spec-lengths", joinInts(spec.DefaultVerifyLengths), "verify graph lengths prepared for speculative decoding"),
		task:    fs.String("spec-task", "", "keep this task's answers for later drafts (retrieval), under the cache dir ($XPU_CACHE_DIR/spec)"),
		always:  fs.Bool("spec-always", false, "verify every draft instead of only those the measured acceptance says pay"),
		stats:   stats,
	}
}

// joinInts is ns comma-separated, as --spec-lengths takes them.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// check validates the flags before the model loads.
func (f *specFlags) check() error {
	switch *f.mode {
	case "auto", "retrieval", "lookup", "off":
	default:
		return fmt.Errorf("--spec %q: must be auto, retrieval, lookup or off", *f.mode)
	}
	_, err := f.verifyLengths()
	return err
}

func (f *specFlags) verifyLengths() ([]int, error) {
	var out []int
	for _, s := range strings.Split(*f.lengths, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 || n > spec.MaxVerifyLength {
			return nil, fmt.Errorf("--spec-lengths %q: each length must be a number between 2 and %d", *f.lengths, spec.MaxVerifyLength)
		}
		out = append(out, n)
	}
	return out, nil
}

// plan is the drafter run uses ("" for none) at temperature temp and its verify lengths, for a
// context of ctxLen tokens. The default lengths that do not fit the context are dropped, so a
// short --ctx backs off to shorter verify passes, and auto turns speculative decoding off when
// none fits; lengths given with --spec-lengths, or an explicit --spec, must fit.
func (f *specFlags) plan(temp float64, ctxLen int) (string, []int, error) {
	kind := *f.mode
	switch kind {
	case "off":
		return "", nil, nil
	case "auto":
		if temp > 0 {
			return "", nil, nil
		}
		kind = "retrieval"
	}
	ls, err := f.verifyLengths()
	if err != nil {
		return "", nil, err
	}
	fit := slices.DeleteFunc(slices.Clone(ls), func(l int) bool { return l > ctxLen })
	switch {
	case len(fit) == len(ls):
		return kind, ls, nil
	case *f.lengths != joinInts(spec.DefaultVerifyLengths):
		return "", nil, fmt.Errorf("--spec-lengths %s: verify lengths must be at most the context length %d", *f.lengths, ctxLen)
	case len(fit) > 0:
		return kind, fit, nil
	case *f.mode == "auto":
		return "", nil, nil
	}
	return "", nil, fmt.Errorf("--spec %s: the context length %d is shorter than every verify length (%s): use a longer --ctx or --spec off",
		*f.mode, ctxLen, *f.lengths)
}

// runnerOptions are the runner's verify graphs when speculative decoding is on.
func (f *specFlags) runnerOptions(temp float64, ctxLen int) ([]llm.RunnerOption, error) {
	kind, ls, err := f.plan(temp, ctxLen)
	if err != nil || kind == "" {
		return nil, err
	}
	return []llm.RunnerOption{spec.WithVerifyLengths(ls...)}, nil
}

// generateOptions builds the drafter for m and a context of ctxLen tokens; stderr gets a
// warning when the history store is unusable (the run goes on without it).
func (f *specFlags) generateOptions(m *llm.Model, temp float64, ctxLen int, stderr io.Writer) ([]llm.GenerateOption, error) {
	var d draft.Drafter
	kind, _, err := f.plan(temp, ctxLen)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "":
		if *f.stats {
			// plain decoding, reported in the same terms
			return []llm.GenerateOption{spec.With(nil)}, nil
		}
		return nil, nil
	case "lookup":
		d = draft.NewLookup()
	case "retrieval":
		opt := draft.RetrievalOptions{}
		if *f.task != "" {
			dir, err := draft.CacheDir()
			if err != nil {
				return nil, err
			}
			h, err := draft.OpenHistory(draft.HistoryPath(dir, *f.task, modelKey(m)), m.Config.Vocab, 0)
			if err != nil {
				fmt.Fprintf(stderr, "xpu run: %v (starting the task's history afresh)\n", err)
			}
			opt.History = h
		}
		d = draft.NewRetrieval(opt)
	}
	var so []spec.Option
	if *f.always {
		so = append(so, spec.Always())
	}
	return []llm.GenerateOption{spec.With(d, so...)}, nil
}

// modelKey identifies a model's vocabulary for the history store: the answers are token ids.
func modelKey(m *llm.Model) string {
	h := sha256.New()
	v := m.Tokenizer.Vocab()
	for _, t := range v.Tokens {
		h.Write([]byte(t))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// printSpecStats writes --stats' report.
func printSpecStats(w io.Writer, res llm.Result) {
	if st := spec.StatsOf(res); st != nil {
		fmt.Fprint(w, st.String())
	}
}
