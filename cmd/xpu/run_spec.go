package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/draft"
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
		lengths: fs.String("spec-lengths", joinInts(llm.DefaultVerifyLengths), "verify graph lengths prepared for speculative decoding"),
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
		if err != nil || n < 2 || n > llm.MaxVerifyLength {
			return nil, fmt.Errorf("--spec-lengths %q: each length must be a number between 2 and %d", *f.lengths, llm.MaxVerifyLength)
		}
		out = append(out, n)
	}
	return out, nil
}

// drafterKind is the drafter run uses ("" for none) at temperature temp.
func (f *specFlags) drafterKind(temp float64) string {
	switch *f.mode {
	case "off":
		return ""
	case "auto":
		if temp > 0 {
			return ""
		}
		return "retrieval"
	}
	return *f.mode
}

// runnerOptions are the runner's verify graphs when speculative decoding is on.
func (f *specFlags) runnerOptions(temp float64) []llm.RunnerOption {
	if f.drafterKind(temp) == "" {
		return nil
	}
	ls, _ := f.verifyLengths() // checked
	return []llm.RunnerOption{llm.WithVerifyLengths(ls...)}
}

// generateOptions builds the drafter for m; stderr gets a warning when the history store is
// unusable (the run goes on without it).
func (f *specFlags) generateOptions(m *llm.Model, temp float64, stderr io.Writer) ([]llm.GenerateOption, error) {
	var d draft.Drafter
	switch f.drafterKind(temp) {
	case "":
		if *f.stats {
			// plain decoding, reported in the same terms
			return []llm.GenerateOption{llm.WithSpeculative(nil)}, nil
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
	var so []llm.SpecOption
	if *f.always {
		so = append(so, llm.SpecAlways())
	}
	return []llm.GenerateOption{llm.WithSpeculative(d, so...)}, nil
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
	if res.Spec == nil {
		return
	}
	fmt.Fprint(w, res.Spec.String())
}
