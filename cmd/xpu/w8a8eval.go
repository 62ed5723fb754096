package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/w8a8"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

func init() {
	register(&command{name: "w8a8-eval", summary: "teacher-forced logits NMSE of W8A8 (shadow off, on, pruned) and Q8_0 against the F32 model", run: runW8A8Eval})
}

// evalText is the default evaluation text: not the calibration text, so the scales and hot
// channels are judged on tokens they were not fitted to.
const evalText = `The little robot woke up early and looked out of the window. It was raining, and the ` +
	`garden was full of puddles. "Can we play outside?" asked the boy. His father shook his head and ` +
	`said they would build a castle from blankets instead. They worked for two hours, and when the ` +
	`castle was finished it had four towers, a secret door and a flag made from an old red shirt. ` +
	`At noon the sun came out, the puddles shone like mirrors, and the boy and the robot ran outside ` +
	`to count the snails on the path: there were seventeen of them, and one was very fast.`

func runW8A8Eval(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, model := modelFlags("w8a8-eval", "GGUF model file", stderr)
	calib := fs.String("calib", "", "calibration file (default: the cache's for this model)")
	text := fs.String("text", "", "evaluation text file (default: a built-in text, not the calibration text)")
	tokens := fs.Int("tokens", 128, "most tokens of the text to use")
	units := fs.String("units", "", "run the W8A8 variants on these units with the default plan (e.g. qnn,neon); default: the reference backend")
	q8 := fs.String("q8-backend", "neon,ref", "backends for the Q8_0 reference points, comma-separated (neon also quantizes activations to Q8_0 blocks, ref does not; empty: leave them out)")
	perChannel := fs.Bool("per-channel", false, "convert the weights per output channel when the file has no int8 weights")
	greedy := fs.Int("greedy", 0, "also generate this many tokens greedily from BOS with each W8A8 variant and count how many of the first match F32 on ref (0: skip)")
	setUsage(fs, stderr, "usage: xpu w8a8-eval [-m] MODEL.gguf [--calib FILE] [--text FILE] [--tokens N] [--units LIST] [--q8-backend neon,ref] [--per-channel] [--greedy N]")
	if code, ok := parseModelArgs(fs, args, model); !ok {
		return code
	}
	if *greedy < 0 {
		return usageExit(stderr, "xpu w8a8-eval: --greedy %d: must be 0 or more", *greedy)
	}
	if *tokens < 2 {
		return usageExit(stderr, "xpu w8a8-eval: --tokens %d: at least 2", *tokens)
	}
	fail := failer(stderr, "xpu w8a8-eval")
	body, m, err := openEval(*text, *model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	path := *calib
	if path == "" {
		if path, err = w8a8.CachePath(w8a8.ModelKey(m.File)); err != nil {
			return fail(err)
		}
	}
	cal, err := w8a8.Load(path)
	if errors.Is(err, os.ErrNotExist) {
		return fail(fmt.Errorf("no calibration for this model at %s (run xpu calibrate first): %w", path, err))
	}
	if err != nil {
		return fail(err)
	}
	ids := m.Tokenizer.Encode(body, true)
	ids = ids[:min(len(ids), *tokens)]
	n := len(ids)
	refB := ref.New()
	defer refB.Close()
	refDev := refB.Devices()[0]
	run := func(mm *llm.Model, dev core.Device, opts ...llm.RunnerOption) ([]float32, error) {
		r, err := llm.NewRunner(ctx, mm, dev, append([]llm.RunnerOption{llm.WithChunkSize(n), llm.WithContextLength(n)}, opts...)...)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return r.TeacherForced(ctx, ids)
	}
	want, err := run(m, refDev)
	if err != nil {
		return fail(fmt.Errorf("F32 reference: %w", err))
	}
	var devs []core.Device
	var specs []sched.UnitSpec
	if *units != "" {
		if specs, err = sched.ParseUnitList(*units); err != nil {
			return fail(err)
		}
		backends, _, err := loader.OpenAll(ctx)
		for _, b := range backends {
			defer b.Close()
		}
		if err != nil {
			return fail(err)
		}
		for _, b := range append(backends, refB) {
			devs = append(devs, b.Devices()...)
		}
	}
	gran := w8a8.PerTensor
	if *perChannel {
		gran = w8a8.PerChannel
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	where := "ref"
	if *units != "" {
		where = *units
	}
	fmt.Fprintf(stdout, "%s: %d tokens teacher-forced, logits against F32 on ref\n", *model, n)
	var wantText []int32
	if *greedy > 0 {
		if wantText, err = greedyTokens(ctx, m, []core.Device{refDev}, nil, *greedy, nil); err != nil {
			return fail(fmt.Errorf("F32 greedy: %w", err))
		}
	}
	fmt.Fprintln(tw, "VARIANT\tUNITS\tNMSE\tTOP-1 AGREE\tSHADOW WORK\tGREEDY MATCH")
	for _, mode := range []w8a8.ShadowMode{w8a8.ShadowOff, w8a8.ShadowOn, w8a8.ShadowPruned} {
		w, err := w8a8.NewLowering(m, w8a8.Config{Calibration: cal, Shadow: mode, Convert: true, Granularity: gran})
		if err != nil {
			return fail(err)
		}
		var got []float32
		if *units == "" {
			got, err = run(m, refDev, w8a8.WithLowering(w))
		} else {
			got, err = plannedLogits(ctx, m, devs, specs, ids, w)
		}
		if err != nil {
			return fail(fmt.Errorf("W8A8 shadow %s: %w", mode, err))
		}
		match := "-"
		if *greedy > 0 {
			gd := []core.Device{refDev}
			if *units != "" {
				gd = devs
			}
			toks, err := greedyTokens(ctx, m, gd, specs, *greedy, w)
			if err != nil {
				return fail(fmt.Errorf("W8A8 shadow %s greedy: %w", mode, err))
			}
			k := 0
			for k < len(toks) && k < len(wantText) && toks[k] == wantText[k] {
				k++
			}
			match = fmt.Sprintf("%d/%d", k, len(wantText))
		}
		fmt.Fprintf(tw, "w8a8 shadow %s (per-%s)\t%s\t%.3g\t%.3f\t%.0f%%\t%s\n", mode, w.Granularity(), where,
			quant.NMSE(got, want), top1(got, want, m.Config.Vocab), 100*w.ShadowWork(), match)
	}
	if *q8 != "" {
		data, err := quant.Pure(m.File, core.Q8_0)
		if err != nil {
			return fail(err)
		}
		qf, err := gguf.Parse(data)
		if err != nil {
			return fail(err)
		}
		qm, err := llm.FromFile(qf)
		if err != nil {
			return fail(err)
		}
		for _, name := range strings.Split(*q8, ",") {
			b, err := loader.Open(ctx, name)
			if err != nil {
				return fail(err)
			}
			defer b.Close()
			got, err := run(qm, b.Devices()[0])
			if err != nil {
				return fail(fmt.Errorf("Q8_0 on %s: %w", name, err))
			}
			fmt.Fprintf(tw, "q8_0\t%s\t%.3g\t%.3f\t-\t-\n", name, quant.NMSE(got, want), top1(got, want, m.Config.Vocab))
		}
	}
	return map[bool]int{true: 0, false: 1}[tw.Flush() == nil]
}

// plannedLogits runs the W8A8 model on the default plan over specs (adapted by w8a8.Plan).
func plannedLogits(ctx context.Context, m *llm.Model, devs []core.Device, specs []sched.UnitSpec, ids []int32, w *w8a8.Lowering) ([]float32, error) {
	plan, err := llm.DefaultPlan(m, devs, specs)
	if err != nil {
		return nil, err
	}
	n := len(ids)
	r, err := llm.NewPlannedRunner(ctx, m, devs, w8a8.Plan(plan), llm.WithChunkSize(n), llm.WithContextLength(n), w8a8.WithLowering(w))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.TeacherForced(ctx, ids)
}

// greedyTokens generates n tokens greedily from BOS: on devs[0] without specs, else on the
// default plan over specs (adapted for W8A8 when w is set).
func greedyTokens(ctx context.Context, m *llm.Model, devs []core.Device, specs []sched.UnitSpec, n int, w *w8a8.Lowering) ([]int32, error) {
	opts := []llm.RunnerOption{llm.WithContextLength(n + 1)}
	if w != nil {
		opts = append(opts, w8a8.WithLowering(w))
	}
	var r *llm.Runner
	var err error
	if specs == nil {
		r, err = llm.NewRunner(ctx, m, devs[0], opts...)
	} else {
		var plan *sched.Plan
		if plan, err = llm.DefaultPlan(m, devs, specs); err == nil {
			r, err = llm.NewPlannedRunner(ctx, m, devs, w8a8.Plan(plan), opts...)
		}
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res, err := r.Generate(ctx, "", llm.WithMaxTokens(n))
	return res.Tokens, err
}

// top1 is the share of positions where got's and want's largest logit are the same token.
func top1(got, want []float32, vocab int) float64 {
	rows := len(want) / vocab
	same := 0
	for i := range rows {
		if argmax(got[i*vocab:(i+1)*vocab]) == argmax(want[i*vocab:(i+1)*vocab]) {
			same++
		}
	}
	return float64(same) / float64(max(rows, 1))
}

// openEval reads an eval command's text (the file at textPath, or evalText when textPath is
// empty) and opens its model; the caller closes the model.
func openEval(textPath, modelPath string) (text string, m *llm.Model, err error) {
	if text, err = readTextOr(textPath, evalText); err != nil {
		return "", nil, err
	}
	if m, err = llm.Open(modelPath); err != nil {
		return "", nil, err
	}
	return text, m, nil
}

// readTextOr is the text of the file at path, or def when path is empty.
func readTextOr(path, def string) (string, error) {
	if path == "" {
		return def, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// openFirstDevice opens the backend name (as --backend gives it) and returns its first device;
// the caller closes the backend.
func openFirstDevice(ctx context.Context, name string) (core.Backend, core.Device, error) {
	b, err := loader.Open(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if len(b.Devices()) == 0 {
		_ = b.Close()
		return nil, nil, fmt.Errorf("backend %s has no device", name)
	}
	return b, b.Devices()[0], nil
}
