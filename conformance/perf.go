package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/kernelbench"
)

// Performance mode: each supported op × shape timed the way llama.cpp's `test-backend-ops
// perf` does (one prepared graph per case, run repeatedly for a time budget after a warm-up,
// the mean time per run), reported as achieved GB/s (the bytes of every input, constant and
// output, as test-backend-ops counts them) and GFLOP/s, beside the device's declared peaks
// (xpu_device_info, ABI 1.1) or, for a CPU that declares no bandwidth, the machine's measured
// read bandwidth. The decode GEMV shapes and weights are those of `xpu bench --kernels`
// (package bench), so the two tools agree on them.

// PerfOptions configure RunPerf.
type PerfOptions struct {
	Device  int            // device index
	Threads int            // the context's "threads" option (0: 2, as `xpu bench --kernels`)
	MinTime time.Duration  // per case (0: 1 s)
	Filter  *regexp.Regexp // only the cases whose name matches
	// ReadBandwidth measures the machine's read bandwidth in bytes/s, for a CPU device that
	// declares none (nil: kernelbench.ReadBandwidth over 512 MiB).
	ReadBandwidth func(ctx context.Context, threads int) (float64, error)
	Progress      io.Writer // one line per finished case; may be nil
}

// PerfResult is one timed case.
type PerfResult struct {
	Name      string  `json:"name"` // "MATMUL 1x4096x4096 q4_0"
	Op        string  `json:"op"`
	Status    Status  `json:"status"` // pass (timed), unsupported, fail (an error)
	Reason    string  `json:"reason,omitempty"`
	Precision string  `json:"precision,omitempty"`
	Runs      int     `json:"runs,omitempty"`
	USPerRun  float64 `json:"us_per_run,omitempty"`
	Bytes     float64 `json:"bytes"` // per run
	FLOP      float64 `json:"flop"`  // per run
	GBps      float64 `json:"gb_per_s,omitempty"`
	GFLOPs    float64 `json:"gflop_per_s,omitempty"`
	PeakGFLOP float64 `json:"peak_gflop_per_s,omitempty"` // at the case's precision; 0 = unknown
}

// PerfReport is the result of RunPerf.
type PerfReport struct {
	Backend BackendRecord `json:"backend"`
	Device  DeviceRecord  `json:"device"`
	Threads int           `json:"threads"`
	Peaks   core.Peaks    `json:"declared_peaks"`
	// PeakGBps is the bandwidth the GB/s column is set against: declared, else measured
	// (CPUs), else 0; PeakGBpsSource says which.
	PeakGBps       float64      `json:"peak_gb_per_s"`
	PeakGBpsSource string       `json:"peak_gb_per_s_source"`
	Results        []PerfResult `json:"results"`
}

// perfCase is one op × shape.
type perfCase struct {
	name, op string
	build    func(r *rand.Rand) (*core.Graph, [][]byte, error)
	flop     float64
}

// perfCases are the ops of an LLM's decode and prefill at the sizes of a 7B model's layer,
// the decode GEMVs at `xpu bench --kernels`' shapes and weights.
func perfCases() []perfCase {
	var cs []perfCase
	for _, s := range kernelbench.GEMVShapes {
		for _, dt := range kernelbench.GEMVTypes {
			cs = append(cs, matmulPerf(s, dt))
		}
	}
	cs = append(cs, matmulPerf(kernelbench.GEMMShapes[0], core.F32))
	// 16 MiB per f32 tensor: past the last-level cache of a phone SoC, so the GB/s is memory's
	const rows, dim = 1024, 4096
	unary := func(name string, op func(g *core.Graph, x *core.Tensor) *core.Tensor, flopPer float64) perfCase {
		return perfCase{name: fmt.Sprintf("%s f32 [%d,%d]", name, rows, dim), op: name, flop: flopPer * rows * dim,
			build: func(r *rand.Rand) (*core.Graph, [][]byte, error) {
				g := core.NewGraph()
				g.Output(op(g, g.Input("x", core.F32, rows, dim)))
				return g, [][]byte{randF32(r, rows*dim)}, g.Err()
			}}
	}
	cs = append(cs,
		perfCase{name: fmt.Sprintf("ADD f32 [%d,%d]", rows, dim), op: "ADD", flop: rows * dim,
			build: func(r *rand.Rand) (*core.Graph, [][]byte, error) {
				g := core.NewGraph()
				g.Output(g.Add(g.Input("a", core.F32, rows, dim), g.Input("b", core.F32, rows, dim)))
				return g, [][]byte{randF32(r, rows*dim), randF32(r, rows*dim)}, g.Err()
			}},
		perfCase{name: fmt.Sprintf("MUL f32 [%d,%d]", rows, dim), op: "MUL", flop: rows * dim,
			build: func(r *rand.Rand) (*core.Graph, [][]byte, error) {
				g := core.NewGraph()
				g.Output(g.Mul(g.Input("a", core.F32, rows, dim), g.Input("b", core.F32, rows, dim)))
				return g, [][]byte{randF32(r, rows*dim), randF32(r, rows*dim)}, g.Err()
			}},
		unary("SILU", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.SiLU(x) }, 4),
		unary("RMS_NORM", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.RMSNorm(x, 1e-6) }, 3),
		unary("SOFTMAX", func(g *core.Graph, x *core.Tensor) *core.Tensor { return g.Softmax(x, 1) }, 4),
		attentionPerf(1, 2048), attentionPerf(64, 2048),
	)
	return cs
}

func matmulPerf(s kernelbench.Shape, dt core.DType) perfCase {
	return perfCase{name: fmt.Sprintf("MATMUL %s %s", s, dt), op: "MATMUL", flop: s.FLOP(),
		build: func(r *rand.Rand) (*core.Graph, [][]byte, error) {
			w, err := kernelbench.Weights(dt, s.N, s.K)
			if err != nil {
				return nil, nil, err
			}
			g := core.NewGraph()
			a := g.Input("a", core.F32, s.M, s.K)
			g.Output(g.MatMul(a, g.Const("w", dt, core.Shape{s.N, s.K}, w)))
			return g, [][]byte{randF32(r, int(s.M*s.K))}, g.Err()
		}}
}

// attentionPerf is a llama-7B-like attention (32 query heads over 8 KV heads of 128, f16 KV)
// of tq queries over a kv-long cache.
func attentionPerf(tq, kv int64) perfCase {
	const hq, hkv, d = 32, 8, 128
	return perfCase{name: fmt.Sprintf("ATTENTION q=[%d,%d,%d] kv=[%d,%d,%d] f16", tq, hq, d, kv, hkv, d), op: "ATTENTION",
		flop: 4 * float64(tq*hq*kv*d),
		build: func(r *rand.Rand) (*core.Graph, [][]byte, error) {
			g := core.NewGraph()
			q := g.Input("q", core.F32, tq, hq, d)
			k := g.Input("k", core.F16, kv, hkv, d)
			v := g.Input("v", core.F16, kv, hkv, d)
			g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: kv - tq}))
			return g, [][]byte{randF32(r, int(tq*hq*d)), randF16(r, int(kv*hkv*d)), randF16(r, int(kv*hkv*d))}, g.Err()
		}}
}

func randF32(r *rand.Rand, n int) []byte {
	b := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(r.Float32()*2-1))
	}
	return b
}

func randF16(r *rand.Rand, n int) []byte {
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], core.F32ToF16(r.Float32()*2-1))
	}
	return b
}

// graphBytes is every input, constant and output byte of g: the memory one run touches at
// least once, test-backend-ops' measure.
func graphBytes(g *core.Graph) float64 {
	var n int64
	for _, t := range g.Inputs {
		n += t.Bytes()
	}
	for _, t := range g.Outputs {
		n += t.Bytes()
	}
	for _, t := range g.Tensors {
		if t.Kind == core.KindConst {
			n += t.Bytes()
		}
	}
	return float64(n)
}

// RunPerf times every perf case the device supports and reports them beside its peaks.
func RunPerf(ctx context.Context, b core.Backend, o PerfOptions) (*PerfReport, error) {
	if b == nil {
		return nil, fmt.Errorf("conformance: nil backend: %w", core.ErrInvalidArgument)
	}
	devs := b.Devices()
	if o.Device < 0 || o.Device >= len(devs) {
		return nil, fmt.Errorf("conformance: %s has %d device(s), no device %d: %w", b.Info().Name, len(devs), o.Device,
			core.ErrNotFound)
	}
	if o.Threads <= 0 {
		o.Threads = 2
	}
	if o.MinTime <= 0 {
		o.MinTime = time.Second
	}
	dev := devs[o.Device]
	info := dev.Info()
	rep := &PerfReport{Backend: backendRecord(b.Info()), Device: deviceRecord(info), Threads: o.Threads, Peaks: info.Peaks}
	switch {
	case info.Peaks.ReadBytesPerSec > 0:
		rep.PeakGBps, rep.PeakGBpsSource = float64(info.Peaks.ReadBytesPerSec)/1e9, "declared"
	case info.Kind == core.DeviceCPU:
		measure := o.ReadBandwidth
		if measure == nil {
			measure = func(ctx context.Context, threads int) (float64, error) {
				return kernelbench.ReadBandwidth(ctx, threads, 512<<20, o.MinTime)
			}
		}
		bw, err := measure(ctx, o.Threads)
		if err != nil {
			return nil, fmt.Errorf("conformance: measuring the read bandwidth: %w", err)
		}
		rep.PeakGBps, rep.PeakGBpsSource = bw/1e9, fmt.Sprintf("measured read bandwidth, %d threads", o.Threads)
	default:
		rep.PeakGBpsSource = "unknown"
	}
	for _, pc := range perfCases() {
		if o.Filter != nil && !o.Filter.MatchString(pc.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		res := timePerfCase(ctx, dev, pc, o)
		res.PeakGFLOP = peakFLOPS(info.Peaks, res.Precision) / 1e9
		rep.Results = append(rep.Results, res)
		if o.Progress != nil {
			fmt.Fprintln(o.Progress, perfLine(res))
		}
	}
	return rep, nil
}

// peakFLOPS is the declared peak at a case's reported precision (int8: the int8 peak; f16 or
// bf16: the f16 one; else f32), 0 when unknown.
func peakFLOPS(p core.Peaks, precision string) float64 {
	switch precision {
	case "int8", "int4":
		return float64(p.OPSInt8)
	case "f16", "bf16":
		return float64(p.FLOPSF16)
	}
	return float64(p.FLOPSF32)
}

// timePerfCase times one case in a context of its own, as `xpu bench --kernels` does: the
// weights of one case (and a backend's repacked copies) are gone before the next.
func timePerfCase(ctx context.Context, dev core.Device, pc perfCase, o PerfOptions) (res PerfResult) {
	res = PerfResult{Name: pc.name, Op: pc.op, FLOP: pc.flop}
	fail := func(err error) PerfResult {
		if errors.Is(err, core.ErrUnsupported) {
			res.Status, res.Reason = StatusUnsupported, err.Error()
		} else {
			res.Status, res.Reason = StatusFail, err.Error()
		}
		return res
	}
	g, inputs, err := pc.build(caseRand(pc.name, 0))
	if err != nil {
		return fail(err)
	}
	res.Bytes = graphBytes(g)
	for _, n := range g.Nodes {
		if q := core.QueryFor(n); dev.OpSupport(q) == core.VerdictNo {
			return fail(fmt.Errorf("op_support: NO for %s: %w", n.Name, core.ErrUnsupported))
		}
	}
	cctx, err := dev.NewContext(ctx, map[string]string{"threads": fmt.Sprint(o.Threads)})
	if err != nil {
		return fail(err)
	}
	// closed last: everything below is released first
	defer func() {
		if err := cctx.Close(); err != nil && res.Status == StatusPass {
			res.Status, res.Reason = StatusFail, fmt.Sprintf("closing the context: %v", err)
		}
	}()
	exe, err := cctx.Prepare(ctx, g)
	if err != nil {
		return fail(err)
	}
	defer exe.Close()
	prec := core.PrecDefault
	for i, v := range exe.Verdicts() {
		if i == 0 || precisionRank(v.Precision) > precisionRank(prec) {
			prec = v.Precision
		}
	}
	res.Precision = prec.String()
	x, err := exe.NewExecution()
	if err != nil {
		return fail(err)
	}
	defer x.Close()
	var bufs []core.Buffer
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()
	bind := func(io int, t *core.Tensor, data []byte) error {
		buf, err := cctx.Alloc(max(t.Bytes(), 1), core.BufferDevice)
		if err != nil {
			return err
		}
		bufs = append(bufs, buf)
		if data != nil {
			if err := buf.Write(0, data); err != nil {
				return err
			}
		}
		return x.Bind(io, buf, 0)
	}
	for i, t := range g.Inputs {
		if err := bind(i, t, inputs[i]); err != nil {
			return fail(err)
		}
	}
	for i, t := range g.Outputs {
		if err := bind(len(g.Inputs)+i, t, nil); err != nil {
			return fail(err)
		}
	}
	runs := 0
	d, err := kernelbench.Time(ctx, func() error { runs++; return x.Run(ctx) }, 3, o.MinTime)
	if err != nil {
		return fail(err)
	}
	res.Status, res.Runs = StatusPass, runs-1 // the warm-up run is not timed
	res.USPerRun = float64(d.Nanoseconds()) / 1e3
	res.GBps = res.Bytes / d.Seconds() / 1e9
	res.GFLOPs = res.FLOP / d.Seconds() / 1e9
	return res
}

func perfLine(r PerfResult) string {
	switch r.Status {
	case StatusPass:
		return fmt.Sprintf("  %s: %d runs, %.1f us/run, %.2f GB/s, %.2f GFLOP/s", r.Name, r.Runs, r.USPerRun, r.GBps, r.GFLOPs)
	case StatusUnsupported:
		return fmt.Sprintf("  %s: unsupported [%s]", r.Name, r.Reason)
	}
	return fmt.Sprintf("  %s: FAIL %s", r.Name, r.Reason)
}

// WriteTable prints the report as a table: each case's time, GB/s and GFLOP/s, and the share
// of the peaks they reach where a peak is known.
func (r *PerfReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s device %d (%s), %d threads\n", r.Backend.Name, r.Device.Index, r.Device.Name, r.Threads)
	bw := "unknown"
	if r.PeakGBps > 0 {
		bw = fmt.Sprintf("%.2f GB/s (%s)", r.PeakGBps, r.PeakGBpsSource)
	}
	fmt.Fprintf(w, "peaks: read %s; f32 %s, f16 %s, int8 %s\n", bw, gflopText(r.Peaks.FLOPSF32),
		gflopText(r.Peaks.FLOPSF16), gflopText(r.Peaks.OPSInt8))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CASE\tPREC\tUS/RUN\tGB/S\t% PEAK BW\tGFLOP/S\t% PEAK FLOP\t")
	for _, c := range r.Results {
		if c.Status != StatusPass {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t%s\n", c.Name, c.Status, strings.SplitN(c.Reason, "\n", 2)[0])
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.2f\t%s\t%.2f\t%s\t\n", c.Name, c.Precision, c.USPerRun, c.GBps,
			share(c.GBps, r.PeakGBps), c.GFLOPs, share(c.GFLOPs, c.PeakGFLOP))
	}
	return tw.Flush()
}

func gflopText(flops uint64) string {
	if flops == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GFLOP/s", float64(flops)/1e9)
}

func share(v, peak float64) string {
	if peak <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*v/peak)
}
