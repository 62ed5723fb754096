package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/kvcache"
	"github.com/xpuhub/xpu/llm/sparse"
)

func init() {
	register(&command{name: "plan-sparse", summary: "profile a ReLU model's FFN neurons, train activation predictors and write the sparse sidecar", run: runPlanSparse})
}

func runPlanSparse(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("plan-sparse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "ReLU-family GGUF model (required)")
	text := fs.String("text", "", "calibration text file (default: the built-in text)")
	budget := fs.String("budget", "", "memory budget the plan is sized for, e.g. 2GiB (required)")
	out := fs.String("o", "", "sidecar to write (default MODEL.sparse.gguf)")
	tokens := fs.Int("tokens", 0, "calibration tokens (default: as many as about 3·10¹¹ weight-token products allow, 48 to 512: 48 for a 7B model)")
	fit := fs.String("fit", sparse.FitSVD, "how predictors are fitted: svd (from the gate weights' truncated SVD; tokens only set the threshold) or train (trained on the calibration tokens' activations)")
	rank := fs.Int("rank", 0, "predictor rank (default 2·min(24, dim/8) for --fit svd, min(32, dim/4) for --fit train)")
	epochs := fs.Int("epochs", 100, "predictor training epochs (--fit train)")
	ctxLen := fs.Int("ctx", 0, "context length the KV cache of the fixed region is sized for (default: the runner's, min(model context, 4096))")
	kvType := fs.String("kv-type", "f32", "KV cache dtype the fixed region is sized for (f32, f16, q8_0, q4_0: xpu run's --kv; f32 sizes for the largest)")
	coldShare := fs.Float64("cold-share", 0.25, "share of the budget left after the fixed region kept for the cold neuron cache")
	seed := fs.Uint64("seed", 1, "training seed")
	recall := fs.Float64("recall", 0.95, "recall the predictor threshold is set for (on calibration tokens not used in training)")
	setUsage(fs, stderr, "usage: xpu plan-sparse --model M [--text FILE] --budget 2GiB [-o FILE]")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *model == "" || *budget == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	fail := failer(stderr, "xpu plan-sparse")
	b, err := sparse.ParseSize(*budget)
	if err != nil {
		return fail(err)
	}
	kv, err := kvcache.ParseType(*kvType)
	if err != nil {
		return fail(fmt.Errorf("--kv-type: %w", err))
	}
	if !(*recall > 0 && *recall <= 1) {
		return fail(fmt.Errorf("--recall %v outside (0, 1]: %w", *recall, core.ErrInvalidArgument))
	}
	if !(*coldShare >= 0 && *coldShare < 1) {
		return fail(fmt.Errorf("--cold-share %v outside [0, 1): %w", *coldShare, core.ErrInvalidArgument))
	}
	m, err := llm.Open(*model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	txt, err := readTextOr(*text, sparse.DefaultText)
	if err != nil {
		return fail(err)
	}
	n := *tokens
	if n <= 0 {
		var params int64
		for i := range m.File.Tensors {
			params += m.File.Tensors[i].Shape.NumElements()
		}
		n = int(min(512, max(48, 3e11/float64(max(params, 1)))))
	}
	toks := m.Tokenizer.Encode(txt, true)
	if len(toks) > n {
		toks = toks[:n]
	}
	t0 := time.Now()
	how := "fitting rank-%s predictors to the gate weights"
	if *fit == sparse.FitTrain {
		how = "training rank-%s predictors"
	}
	fmt.Fprintf(stdout, "profiling %d tokens through %d layers (Go forward pass), "+how+"\n", len(toks), m.Config.Layers, rankStr(*rank))
	p, rep, err := sparse.BuildPlan(ctx, m, sparse.PlanOptions{Tokens: toks, Budget: b, Context: *ctxLen, KVType: kv,
		Fit: *fit, Rank: *rank, Epochs: *epochs, Recall: *recall, ColdShare: *coldShare, Seed: *seed,
		Progress: func(l, total int) {
			fmt.Fprintf(stderr, "\rlayer %d/%d (%.0f s)", l, total, time.Since(t0).Seconds())
			if l == total {
				fmt.Fprintln(stderr)
			}
		}})
	if err != nil {
		return fail(err)
	}
	fx := rep.Fixed
	fmt.Fprintf(stdout, "budget %.1f MiB: fixed %.1f MiB (non-FFN weights %.1f, KV %.1f, predictors %.1f), hot %.1f MiB (%d of %d neurons), cold cache %.1f MiB; bundle row %d bytes\n",
		mb(b), mb(fx.Total()), mb(fx.Weights), mb(fx.KV), mb(fx.Predictors), mb(rep.HotBytes), sumInts(rep.HotCounts),
		rep.TotalNeurs, mb(rep.ColdBytes), rep.RowBytes)
	fmt.Fprintf(stdout, "layer  sparsity  hot  recall  precision  (held out: %d of %d tokens)\n", rep.HeldOut, rep.Tokens)
	var rs, ps float64
	for l, q := range rep.Quality {
		fmt.Fprintf(stdout, "%5d  %8.3f  %5d  %6.3f  %9.3f\n", l, rep.Sparsity[l], rep.HotCounts[l], q.Recall, q.Precision)
		rs += q.Recall
		ps += q.Precision
	}
	L := float64(len(rep.Quality))
	fmt.Fprintf(stdout, "mean   recall %.3f  precision %.3f\n", rs/L, ps/L)
	path := *out
	if path == "" {
		path = sparse.DefaultPath(*model)
	}
	if err := sparse.WriteFile(path, p); err != nil {
		return fail(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "%s: %.1f MB in %.1f s\n", path, float64(st.Size())/1e6, time.Since(t0).Seconds())
	return 0
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

func rankStr(r int) string {
	if r == 0 {
		return "default"
	}
	return fmt.Sprint(r)
}
