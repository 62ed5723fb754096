package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/sparse"
)

// sparseFlags are run's sparse FFN flags.
type sparseFlags struct {
	mode      *string
	sidecar   *string
	budget    *string
	predictor *string
	recall    *int
	eviction  *string
	thOffset  *float64
	readers   *int
	prefetch  *bool
	pin       *string
	gap       *string
}

func addSparseFlags(fs *flag.FlagSet) *sparseFlags {
	return &sparseFlags{
		mode: fs.String("sparse", "auto", "sparse FFN (ReLU-family models planned by xpu plan-sparse): on, off (dense, always works), "+
			"auto (on when the sidecar exists)"),
		sidecar: fs.String("sidecar", "", "the sparse sidecar (default MODEL.sparse.gguf)"),
		budget: fs.String("budget", "", "with --sparse: memory budget, e.g. 2GiB (default: the one the sidecar was planned for); "+
			"fixed weights, KV cache, hot neurons and the cold neuron cache live in it"),
		predictor: fs.String("predictor", "trained", "with --sparse: trained (the sidecar's) or oracle (every truly active neuron, "+
			"computed on the host from all gate rows: for accuracy checks, slow)"),
		eviction: fs.String("eviction", "lru", "with --sparse: the cold neuron cache's replacement policy, lru or lfu (least frequently used)"),
		thOffset: fs.Float64("threshold-offset", 0, "with --sparse: added to the trained predictor's threshold (logits); above 0 selects "+
			"and reads fewer neurons per token at some recall (check with xpu sparse-eval --threshold-offset)"),
		readers:  fs.Int("io-readers", 16, "with --sparse: cold reads in flight at once (each with a 1 MiB buffer in the budget; flash serves deep queues fastest)"),
		prefetch: fs.Bool("prefetch", true, "with --sparse: while a layer computes, read the next layer's predicted neurons (look-ahead)"),
		pin: fs.String("pin-fixed", "auto", "with --sparse: lock the fixed region's weights (attention, norms, embeddings, output) in memory: "+
			"on, off, or auto (on when the budget is below the model's weights). Meant for units that compute from the file mapping "+
			"(neon{repack=0}); a unit that repacks its weights holds its own copy"),
		gap: fs.String("io-gap", "32KiB", "with --sparse: missing rows of a layer at most this far apart in the sidecar are read in one "+
			"request (the rows between are read too): larger means fewer, larger reads for more bytes"),
		recall: fs.Int("recall-every", 0, "with --sparse --stats: measure the predictor's recall on every Nth layer step (0: off; costs host time)"),
	}
}

// check validates the flags before the model loads.
func (f *sparseFlags) check() error {
	switch *f.mode {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("--sparse %q: must be on, off or auto", *f.mode)
	}
	switch *f.predictor {
	case "trained", "oracle":
	default:
		return fmt.Errorf("--predictor %q: must be trained or oracle", *f.predictor)
	}
	if _, err := parseEviction(*f.eviction); err != nil {
		return err
	}
	if math.IsNaN(*f.thOffset) || math.IsInf(*f.thOffset, 0) {
		return fmt.Errorf("--threshold-offset %v: must be a finite number", *f.thOffset)
	}
	if g, err := sparse.ParseSize(*f.gap); err != nil || g < 0 {
		return fmt.Errorf("--io-gap %q: must be a size such as 32KiB or 0", *f.gap)
	}
	switch *f.pin {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("--pin-fixed %q: must be on, off or auto", *f.pin)
	}
	if *f.readers < 1 || *f.readers > 64 {
		return fmt.Errorf("--io-readers %d: must be 1 to 64", *f.readers)
	}
	if *f.recall < 0 {
		return fmt.Errorf("--recall-every %d: must be 0 (off) or more", *f.recall)
	}
	if *f.budget != "" {
		if _, err := sparse.ParseSize(*f.budget); err != nil {
			return fmt.Errorf("--budget: %w", err)
		}
	}
	return nil
}

// path is the sidecar run uses, "" for a dense run: --sparse off, or auto without a sidecar.
func (f *sparseFlags) path(model string) (string, error) {
	if *f.mode == "off" {
		return "", nil
	}
	p := *f.sidecar
	if p == "" {
		p = sparse.DefaultPath(model)
	}
	if _, err := os.Stat(p); err != nil {
		if *f.mode == "auto" && *f.sidecar == "" && errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("--sparse: sidecar %s: %w (write one with xpu plan-sparse, or run with --sparse off)", p, err)
	}
	return p, nil
}

// open opens the sidecar at path for m and the sparse runtime the runner drives; closing the
// runtime and the sidecar is the caller's, after the runner's.
func (f *sparseFlags) open(ctx context.Context, m *llm.Model, path string, ctxLen int, kv core.DType) (*sparse.Runtime, *sparse.Sidecar, error) {
	sc, err := sparse.OpenFor(path, m)
	if err != nil {
		return nil, nil, fmt.Errorf("--sparse: %w (run with --sparse off for dense decoding)", err)
	}
	if ctxLen == 0 {
		ctxLen = min(m.Config.ContextLength, 4096)
	}
	opts := []sparse.RuntimeOption{sparse.WithContext(ctxLen, kv)}
	budget := int64(sc.BudgetBytes)
	if *f.budget != "" {
		budget, _ = sparse.ParseSize(*f.budget) // checked
		opts = append(opts, sparse.WithBudget(budget))
	}
	gap, _ := sparse.ParseSize(*f.gap) // checked
	opts = append(opts, sparse.WithCoalesceGap(gap))
	opts = append(opts, sparse.WithPinnedFixed(*f.pin == "on" || (*f.pin == "auto" && tightBudget(budget, m))))
	ev, _ := parseEviction(*f.eviction) // checked
	opts = append(opts, sparse.WithEviction(ev), sparse.WithThresholdOffset(float32(*f.thOffset)), sparse.WithReaders(*f.readers),
		sparse.WithPrefetch(*f.prefetch))
	if *f.predictor == "oracle" {
		or, err := sparse.NewOracle(sc, 0)
		if err != nil {
			return nil, nil, errors.Join(err, sc.Close())
		}
		opts = append(opts, sparse.WithPredictor(or))
	}
	if *f.recall > 0 {
		opts = append(opts, sparse.WithRecallSampling(*f.recall))
	}
	rt, err := sparse.NewRuntime(ctx, m, sc, path, opts...)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("--sparse: %w", err), sc.Close())
	}
	return rt, sc, nil
}

// tightBudget says whether a sparse budget is below the model's weights: then the fixed
// region is pinned (--pin-fixed auto) and the prompt runs on the decode programs.
func tightBudget(budget int64, m *llm.Model) bool { return budget < m.WeightBytes() }

// parseEviction parses --eviction.
func parseEviction(s string) (sparse.Eviction, error) {
	switch s {
	case "lru":
		return sparse.EvictLRU, nil
	case "lfu":
		return sparse.EvictLeastFrequent, nil
	}
	return 0, fmt.Errorf("--eviction %q: must be lru or lfu", s)
}

// flagSet says whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
