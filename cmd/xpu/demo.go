package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/sched"
)

func init() {
	register(&command{name: "demo", summary: "run a transformer block on every usable device and compare with the reference", run: runDemo})
}

// maxDemoSize bounds --tokens and --dim (a 65536-wide block's weights are 4 GiB of f32).
const maxDemoSize = 1 << 16

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tokens := fs.Int64("tokens", 16, "tokens in the block's input")
	dim := fs.Int64("dim", 256, "model dimension")
	wtype := fs.String("weights", "q8_0", "weight dtype: f32, f16, q8_0, q4_0")
	runs := fs.Int("runs", 5, "timed runs per device (the median is shown)")
	seed := fs.Uint64("seed", 1, "seed of weights and inputs")
	model := fs.String("model", defaultDemoModel, "model of the text-generation part (absent: a synthetic one)")
	genTokens := fs.Int("n", 48, "tokens the text-generation part generates (0: skip it)")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	dt, err := core.ParseDType(*wtype)
	if err != nil {
		fmt.Fprintln(stderr, "xpu demo:", err)
		return 2
	}
	// the weights are made in host memory before any check of the graph: a negative or huge
	// size would panic there
	if *tokens < 0 || *tokens > maxDemoSize || *dim < 0 || *dim > maxDemoSize {
		fmt.Fprintf(stderr, "xpu demo: --tokens and --dim must be between 0 and %d\n", maxDemoSize)
		return 2
	}
	if *runs < 1 {
		fmt.Fprintf(stderr, "xpu demo: --runs %d: must be 1 or more\n", *runs)
		return 2
	}
	cfg := blockConfig{Tokens: *tokens, Dim: *dim, Heads: 8, KVHeads: 4, FFN: *dim * 8 / 3 / 32 * 32, WeightType: dt}
	g, err := buildBlock(cfg, *seed)
	if err != nil {
		fmt.Fprintln(stderr, "xpu demo:", err)
		return 1
	}
	inputs := blockInputs(cfg, *seed)
	fmt.Fprintf(stdout, "transformer block: %d tokens, dim %d, %d heads (%d kv), ffn %d, %s weights, %d nodes\n\n",
		cfg.Tokens, cfg.Dim, cfg.Heads, cfg.KVHeads, cfg.FFN, dt, len(g.Nodes))

	start := time.Now()
	want, err := ref.Run(ctx, g, inputs)
	if err != nil {
		fmt.Fprintln(stderr, "xpu demo: reference:", err)
		return 1
	}
	refTime := time.Since(start)

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tKIND\tMAX ABS ERR\tNMSE\tTIME (median)\tSTATUS")
	fmt.Fprintf(tw, "ref:0\tcpu\t0\t0\t%s\treference (float64)\n", refTime.Round(time.Microsecond))

	backends, _, err := loader.OpenAll(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "xpu demo:", err)
		return 1
	}
	failed := false
	peak := peakAbs(core.DecodeF32(want[0]))
	for _, b := range backends {
		defer b.Close()
		for _, dev := range b.Devices() {
			info := dev.Info()
			res := demoOnDevice(ctx, dev, g, inputs, want[0], *runs)
			status := "ok"
			if res.err != nil {
				status = "error: " + res.err.Error()
				if res.unsupported {
					status = "unsupported: " + res.err.Error()
				}
				failed = failed || !res.unsupported
			} else if err := demoVerdict(ctx, dev, g, dt, res.nmse, res.maxAbs, peak); err != nil {
				// a device that runs but disagrees with the reference fails the demo
				status = "MISMATCH: " + err.Error()
				failed = true
			}
			if info.Caps.Has(core.CapEmulated) {
				status += " (emulated provider, not hardware)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", info.ID(), info.Kind, fmtFloat(res.maxAbs), fmtFloat(res.nmse),
				res.median.Round(time.Microsecond), status)
		}
	}
	tw.Flush()
	if *genTokens > 0 {
		fmt.Fprintln(stdout)
		path := *model
		if _, err := os.Stat(path); err != nil {
			path = ""
		}
		if err := demoText(ctx, stdout, backends, path, *genTokens); err != nil {
			fmt.Fprintln(stderr, "xpu demo: text generation:", err)
			failed = true
		}
	}
	if failed {
		return 1
	}
	return 0
}

type demoResult struct {
	maxAbs, nmse float64
	median       time.Duration
	err          error
	unsupported  bool
}

func demoOnDevice(ctx context.Context, dev core.Device, g *core.Graph, inputs [][]byte, want []byte, runs int) demoResult {
	res := demoResult{maxAbs: math.NaN(), nmse: math.NaN()}
	s, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict())
	if err != nil {
		res.err, res.unsupported = err, isUnsupported(err)
		return res
	}
	defer s.Close()
	var times []time.Duration
	var got [][]byte
	for i := 0; i < max(runs, 1)+1; i++ { // the first run warms up
		t0 := time.Now()
		got, err = s.Run(ctx, inputs)
		if err != nil {
			res.err = err
			return res
		}
		if i > 0 {
			times = append(times, time.Since(t0))
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	res.median = times[len(times)/2]
	res.maxAbs, res.nmse = compareF32(core.DecodeF32(got[0]), core.DecodeF32(want))
	return res
}

// compareF32 returns the max absolute error and the NMSE (sum of squared errors over the sum
// of squares of the reference).
func compareF32(got, want []float32) (maxAbs, nmse float64) {
	if len(got) != len(want) {
		return math.Inf(1), math.Inf(1)
	}
	var se, ss float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		maxAbs = math.Max(maxAbs, math.Abs(d))
		se += d * d
		ss += float64(want[i]) * float64(want[i])
	}
	if ss == 0 {
		return maxAbs, se
	}
	return maxAbs, se / ss
}

func fmtFloat(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.2e", x)
}
