package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/w8a8"
)

func init() {
	register(&command{name: "calibrate", summary: "calibrate a model for W8A8 on the NPU: activation scales, outlier thresholds, hot channels, shadow pruning", run: runCalibrate})
}

func runCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, model := modelFlags("calibrate", "GGUF model file", stderr)
	text := fs.String("text", "", "calibration text file (default: the built-in text)")
	out := fs.String("o", "", "write the calibration here (default: the cache, $XPU_CACHE_DIR/w8a8/<model key>.json, where xpu run --w8a8 finds it)")
	backend := fs.String("backend", "ref", "backend to run the float model on (ref: exact, fine for small models)")
	tokens := fs.Int("tokens", 256, "most tokens of the text to use")
	noImp := fs.Bool("no-importance", false, "rank layers by mllm-NPU's max|outlier|/scale instead of measuring each layer's effect on the logits")
	perChannel := fs.Bool("per-channel", false, "measure importance with per-output-channel int8 weights (when the file has none of its own)")
	keep := fs.Float64("keep", w8a8.DefaultRule.Keep, "share of the layers that keep the shadow path when pruned")
	pct := fs.Float64("percentile", w8a8.DefaultRule.Percentile, "percentile of |x| over the non-outlier channels that sets the activation scale")
	hotFrac := fs.Float64("hot-fraction", w8a8.DefaultRule.HotFraction, "most channels per input whose weight columns stay resident for the shadow path, as a share of the input's width")
	hotCover := fs.Float64("hot-cover", w8a8.DefaultRule.HotCover, "share of the calibration's outliers the hot channels should hold")
	ratio := fs.Float64("outlier-ratio", w8a8.DefaultRule.OutlierRatio, "a channel whose maximum exceeds this many times the median channel's is an outlier channel (left out of the scale)")
	setUsage(fs, stderr, "usage: xpu calibrate [-m] MODEL.gguf [--text FILE] [-o FILE] [--backend ref] [--tokens N] [--keep F] [--percentile P] [--hot-fraction F] [--hot-cover F] [--outlier-ratio R] [--no-importance] [--per-channel]")
	if code, ok := parseModelArgs(fs, args, model); !ok {
		return code
	}
	if *tokens < 8 {
		return usageExit(stderr, "xpu calibrate: --tokens %d: at least 8", *tokens)
	}
	rule := w8a8.DefaultRule
	rule.Keep, rule.Percentile, rule.HotFraction, rule.HotCover, rule.OutlierRatio = *keep, *pct, *hotFrac, *hotCover, *ratio
	if err := rule.Check(); err != nil {
		return usageExit(stderr, "xpu calibrate: %v", err)
	}
	fail := failer(stderr, "xpu calibrate")
	calText, err := readTextOr(*text, w8a8.DefaultCalibrationText)
	if err != nil {
		return fail(err)
	}
	m, err := llm.Open(*model)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	b, dev, err := openFirstDevice(ctx, *backend)
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	gran := w8a8.PerTensor
	if *perChannel {
		gran = w8a8.PerChannel
	}
	t0 := time.Now()
	cal, err := w8a8.Calibrate(ctx, m, dev, calText, w8a8.WithRule(rule),
		w8a8.WithTokens(*tokens), w8a8.WithImportance(!*noImp), w8a8.WithGranularity(gran))
	if err != nil {
		return fail(err)
	}
	path := *out
	if path == "" {
		if path, err = w8a8.CachePath(cal.Model); err != nil {
			return fail(err)
		}
	}
	if err := cal.Save(path); err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "%s: model %s, %d tokens, %d layers in %.1f s\n", path, cal.Model, cal.Tokens, len(cal.Layers), time.Since(t0).Seconds())
	fmt.Fprintln(stdout, "layer  scale(attn_in/attn_out_in/ffn_in/ffn_down_in)      hot channels  max|x|/scale  importance  shadow")
	for l, ly := range cal.Layers {
		var scales, hots []string
		for _, in := range ly.Inputs {
			scales = append(scales, fmt.Sprintf("%.3g", in.Scale))
			hots = append(hots, fmt.Sprint(len(in.Hot)))
		}
		fmt.Fprintf(stdout, "%5d  %-44s  %-12s  %12.1f  %10.3g  %v\n", l, strings.Join(scales, "/"),
			strings.Join(hots, "/"), ly.Ratio, ly.Importance, ly.Shadow)
	}
	return 0
}
