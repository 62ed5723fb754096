package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/quant"
	"github.com/xpuhub/xpu/llm/w8a8"
)

func init() {
	register(&command{name: "quantize", summary: "quantize a GGUF model like llama-quantize (--type q4_k_m, q8_0, ...)", run: runQuantize})
}

func runQuantize(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("quantize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	typ := fs.String("type", "q4_k_m", "quantization: "+strings.Join(quant.Recipes(), ", "))
	requant := fs.Bool("allow-requantize", false, "also requantize tensors that are already quantized (loses more than quantizing the float model)")
	npu := fs.Bool("npu-int8", false, "instead of --type: keep every tensor and add symmetric int8 weights + scales for the NPU's W8A8 MatMul (layout: llm/w8a8)")
	perChannel := fs.Bool("per-channel", false, "with --npu-int8: one weight scale per output channel instead of per tensor")
	setUsage(fs, stderr,
		"usage: xpu quantize [--type q4_k_m] [--allow-requantize] IN.gguf OUT.gguf",
		"       xpu quantize --npu-int8 [--per-channel] IN.gguf OUT.gguf",
	)
	if code, ok := parseInterspersed(fs, args); !ok {
		return code
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return 2
	}
	in, out := fs.Arg(0), fs.Arg(1)
	fail := failer(stderr, "xpu quantize")
	typeSet := false
	fs.Visit(func(f *flag.Flag) { typeSet = typeSet || f.Name == "type" })
	if *npu && typeSet || *perChannel && !*npu {
		return usageExit(stderr, "xpu quantize: --npu-int8 keeps the model's own dtypes (no --type); --per-channel goes with --npu-int8")
	}
	recipe, err := quant.ParseRecipe(*typ)
	if err != nil {
		return fail(err)
	}
	if same, err := sameFile(in, out); err != nil || same {
		if err == nil {
			err = fmt.Errorf("%s: the output would overwrite the input: %w", out, core.ErrInvalidArgument)
		}
		return fail(err)
	}
	f, err := gguf.Open(in)
	if err != nil {
		return fail(err)
	}
	defer f.Close()

	opts := []quant.Option{quant.WithRequantize(*requant)}
	if isTerminal(stderr) {
		opts = append(opts, quant.WithProgress(func(done, total int, p quant.TensorPlan) {
			drawQuantizeProgress(stderr, done, total, p)
		}))
	}
	// Write next to the output and rename at the end, so an interrupted run leaves no half file.
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*.tmp")
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	err = tmp.Chmod(0o644) // CreateTemp's 0600 would make the model private to its writer
	var sum quant.Summary
	var nsum w8a8.Summary
	gran := w8a8.PerTensor
	if *perChannel {
		gran = w8a8.PerChannel
	}
	if err == nil && *npu {
		nsum, err = w8a8.WriteModel(ctx, tmp, f, gran)
	} else if err == nil {
		sum, err = quant.Model(ctx, tmp, f, recipe, opts...)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fail(err)
	}
	if *npu {
		fmt.Fprintf(stdout, "%s: npu-int8 per %s, %d matrices given int8 weights (+%.2f MB), every original kept, in %.1f s\n",
			out, gran, nsum.Matrices, float64(nsum.Bytes)/1e6, time.Since(t0).Seconds())
		return 0
	}
	fmt.Fprintf(stdout, "%s: %s, %d tensors (%s), %d quantized, %d fallbacks, %.2f MB -> %.2f MB in %.1f s\n",
		out, recipe.Name, len(f.Tensors), dtypeCounts(sum.Tensors), sum.Quantized, sum.Fallbacks,
		float64(sum.BytesIn)/1e6, float64(sum.BytesOut)/1e6, time.Since(t0).Seconds())
	return 0
}

// dtypeCounts formats {q4_k: 20, f32: 11} as "q4_k 20, f32 11" in dtype order.
func dtypeCounts(m map[core.DType]int) string {
	dts := make([]core.DType, 0, len(m))
	for dt := range m {
		dts = append(dts, dt)
	}
	slices.Sort(dts)
	parts := make([]string, len(dts))
	for i, dt := range dts {
		parts[i] = fmt.Sprintf("%s %d", dt, m[dt])
	}
	return strings.Join(parts, ", ")
}

// drawQuantizeProgress redraws one status line: the tensor being written and its conversion.
func drawQuantizeProgress(w io.Writer, done, total int, p quant.TensorPlan) {
	if done == total {
		fmt.Fprintf(w, "\r\033[K[%d/%d] done\n", done, total)
		return
	}
	conv := p.From.String()
	if p.To != p.From {
		conv += " -> " + p.To.String()
	}
	fmt.Fprintf(w, "\r\033[K[%*d/%d] %s %s %s", len(fmt.Sprint(total)), done+1, total, p.Name, p.Shape, conv)
}

// sameFile reports whether a and b name the same existing file (b may not exist yet).
func sameFile(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(sa, sb), nil
}
