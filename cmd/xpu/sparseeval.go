package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/sparse"
)

func init() {
	register(&command{name: "sparse-eval", summary: "accuracy of the sparse FFN: teacher-forced logits NMSE, top-1 agreement, predictor recall and greedy match against dense decoding", run: runSparseEval})
}

func runSparseEval(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, model := modelFlags("sparse-eval", "ReLU-family GGUF model", stderr)
	sidecar := fs.String("sidecar", "", "the sparse sidecar (default MODEL.sparse.gguf)")
	budget := fs.String("budget", "", "memory budget of the sparse runs (default: the sidecar's)")
	text := fs.String("text", "", "evaluation text file (default: a built-in text, not the calibration text)")
	tokens := fs.Int("tokens", 64, "most tokens of the text to use")
	backend := fs.String("backend", "neon", "backend of every run (neon, ref, ...)")
	greedy := fs.Int("greedy", 32, "also generate this many tokens greedily from BOS with each variant and count the leading tokens that match dense (0: skip)")
	oracle := fs.Bool("oracle", true, "also evaluate the oracle predictor (every truly active neuron; slow for big models)")
	thOffset := fs.Float64("threshold-offset", 0, "added to the trained predictor's threshold (as xpu run --threshold-offset)")
	setUsage(fs, stderr, "usage: xpu sparse-eval [-m] MODEL.gguf [--sidecar FILE] [--budget SIZE] [--text FILE] [--tokens N] [--backend NAME] [--greedy N] [--oracle=false] [--threshold-offset F]")
	if code, ok := parseModelArgs(fs, args, model); !ok {
		return code
	}
	if math.IsNaN(*thOffset) || math.IsInf(*thOffset, 0) {
		return usageExit(stderr, "xpu sparse-eval: --threshold-offset %v: must be a finite number", *thOffset)
	}
	if *tokens < 2 || *greedy < 0 {
		return usageExit(stderr, "xpu sparse-eval: --tokens %d (at least 2) and --greedy %d (0 or more)", *tokens, *greedy)
	}
	fail := failer(stderr, "xpu sparse-eval")
	var b int64
	if *budget != "" {
		var err error
		if b, err = sparse.ParseSize(*budget); err != nil {
			return fail(fmt.Errorf("--budget: %w", err))
		}
	}
	path := *sidecar
	if path == "" {
		path = sparse.DefaultPath(*model)
	}
	body, m, err := openEval(*text, *model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	sc, err := sparse.OpenFor(path, m)
	if err != nil {
		return fail(err)
	}
	defer sc.Close()
	be, dev, err := openFirstDevice(ctx, *backend)
	if err != nil {
		return fail(err)
	}
	defer be.Close()
	ids := m.Tokenizer.Encode(body, true)
	ids = ids[:min(len(ids), *tokens)]
	n := len(ids)
	ctxLen := max(n, *greedy) + 1
	// One token per pass, as decoding runs: a chunk's sparse FFN uses the union of its rows'
	// neurons, which would flatter the predictor.
	base := []llm.RunnerOption{llm.WithChunkSize(1), llm.WithContextLength(ctxLen)}
	type result struct {
		logits []float32
		greedy []int32
		stats  *sparse.RuntimeStats
	}
	run := func(pred sparse.Predictor) (res result, err error) {
		opts := base
		var rt *sparse.Runtime
		{
			ro := []sparse.RuntimeOption{sparse.WithContext(ctxLen, core.F32), sparse.WithRecallSampling(1)}
			if b > 0 {
				ro = append(ro, sparse.WithBudget(b))
			}
			if pred != nil {
				ro = append(ro, sparse.WithPredictor(pred))
			} else {
				ro = append(ro, sparse.WithThresholdOffset(float32(*thOffset)))
			}
			if rt, err = sparse.NewRuntime(ctx, m, sc, path, ro...); err != nil {
				return res, err
			}
			defer func() { err = errors.Join(err, rt.Close()) }()
			opts = append(opts, sparse.WithFFN(rt))
		}
		r, err := llm.NewRunner(ctx, m, dev, opts...)
		if err != nil {
			return res, err
		}
		defer func() { err = errors.Join(err, r.Close()) }()
		if res.logits, err = r.TeacherForced(ctx, ids); err != nil {
			return res, err
		}
		if rt != nil {
			st := rt.Stats()
			res.stats = &st
		}
		if *greedy > 0 {
			r.Reset()
			g, err := r.Generate(ctx, "", llm.WithMaxTokens(*greedy))
			if err != nil {
				return res, err
			}
			res.greedy = g.Tokens
		}
		return res, nil
	}
	dense, err := llm.NewRunner(ctx, m, dev, base...)
	if err != nil {
		return fail(err)
	}
	want, err := dense.TeacherForced(ctx, ids)
	var wantText []int32
	if err == nil && *greedy > 0 {
		dense.Reset()
		var g llm.Result
		if g, err = dense.Generate(ctx, "", llm.WithMaxTokens(*greedy)); err == nil {
			wantText = g.Tokens
		}
	}
	err = errors.Join(err, dense.Close())
	if err != nil {
		return fail(fmt.Errorf("dense: %w", err))
	}
	fmt.Fprintf(stdout, "%s: %d tokens teacher-forced one at a time on %s, logits against dense\n", *model, n, dev.Info().Backend)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PREDICTOR\tNMSE\tTOP-1 AGREE\tRECALL\tPRECISION\tGREEDY MATCH")
	variants := []struct {
		name string
		pred sparse.Predictor
	}{{"trained", nil}}
	if *oracle {
		or, err := sparse.NewOracle(sc, 0)
		if err != nil {
			return fail(err)
		}
		variants = append(variants, struct {
			name string
			pred sparse.Predictor
		}{"oracle", or})
	}
	for _, v := range variants {
		res, err := run(v.pred)
		if err != nil {
			return fail(fmt.Errorf("%s predictor: %w", v.name, err))
		}
		rec, prec := "-", "-"
		if s := res.stats; s != nil && s.RecallSamples > 0 {
			rec, prec = fmt.Sprintf("%.4f", s.Recall), fmt.Sprintf("%.4f", s.Precision)
		}
		match := "-"
		if *greedy > 0 {
			k := 0
			for k < min(len(res.greedy), len(wantText)) && res.greedy[k] == wantText[k] {
				k++
			}
			match = fmt.Sprintf("%d/%d", k, len(wantText))
		}
		fmt.Fprintf(tw, "%s\t%.3g\t%.3f\t%s\t%s\t%s\n", v.name, quant.NMSE(res.logits, want), top1(res.logits, want, m.Config.Vocab), rec, prec, match)
	}
	if err := tw.Flush(); err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "offline (plan-sparse, held-out calibration tokens): mean recall %.4f\n", mean32(sc.Recall))
	return 0
}

func mean32(xs []float32) float64 {
	var s float64
	for _, x := range xs {
		s += float64(x)
	}
	return s / float64(max(len(xs), 1))
}
