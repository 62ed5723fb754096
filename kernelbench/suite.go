package kernelbench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/xpuhub/xpu/core"
)

// Row is one figure of the suite.
type Row struct {
	Case      string  // "GEMM 128x2048x2048", "GEMV 1x4096x4096 q4_0", "read bandwidth"
	Contender string  // device id, "openblas" or "machine"
	Value     float64 // in Unit
	Unit      string  // "GFLOP/s" or "GB/s"
}

// Options configure Suite.
type Options struct {
	Threads  int           // per contender (0: 2)
	Device   core.Device   // the device under test
	Ref      core.Device   // the reference to compare with on the small shapes; nil: none
	Harness  *Harness      // OpenBLAS and read bandwidth; nil: those rows are left out
	Quick    bool          // the small shapes only, fewer iterations
	MinTime  time.Duration // per figure (0: 1 s, or 200 ms with Quick)
	Progress io.Writer     // one line per finished figure; may be nil
}

// refMaxFLOP bounds the shapes the float64 reference is timed on: it runs at a few GFLOP/s at
// best, and one iteration of the largest GEMM would take minutes.
const refMaxFLOP = 2.2e9

// Suite measures GEMM (GFLOP/s), GEMV (GB/s of weights) and the read bandwidth the GEMV is
// bounded by, for the device, the reference and OpenBLAS.
func Suite(ctx context.Context, o Options) ([]Row, error) {
	if o.Device == nil {
		return nil, fmt.Errorf("bench: no device: %w", core.ErrInvalidArgument)
	}
	if o.Threads <= 0 {
		o.Threads = 2
	}
	minIters, minTime := 3, time.Second
	gemm, gemv := GEMMShapes, GEMVShapes
	if o.Quick {
		minIters, minTime = 2, 200*time.Millisecond
		gemm, gemv = gemm[:1], gemv[:1]
	}
	if o.MinTime > 0 {
		minTime = o.MinTime
	}
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "%-28s %-10s %9.2f %s\n", r.Case, r.Contender, r.Value, r.Unit)
		}
	}
	timeMatMul := func(dev core.Device, s Shape, dt core.DType) (time.Duration, error) {
		m, err := NewMatMul(ctx, dev, o.Threads, s, dt)
		if err != nil {
			return 0, err
		}
		defer m.Close()
		return Time(ctx, func() error { return m.Run(ctx) }, minIters, minTime)
	}
	if o.Harness != nil {
		buf := make([]uint64, 64<<20) // 512 MiB: several times any LLC
		for i := range buf {
			buf[i] = uint64(i)
		}
		d, err := Time(ctx, func() error { o.Harness.Read(buf, o.Threads); return nil }, minIters, minTime)
		if err != nil {
			return rows, err
		}
		add(Row{"read bandwidth 512 MiB", "machine", float64(8*len(buf)) / d.Seconds() / 1e9, "GB/s"})
	}
	for _, s := range gemm {
		devs := []core.Device{o.Device}
		if o.Ref != nil && s.FLOP() <= refMaxFLOP {
			devs = append(devs, o.Ref)
		}
		for _, dev := range devs {
			d, err := timeMatMul(dev, s, core.F32)
			if err != nil {
				return rows, err
			}
			add(Row{"GEMM " + s.String(), dev.Info().ID(), s.FLOP() / d.Seconds() / 1e9, "GFLOP/s"})
		}
		if o.Harness != nil {
			a, c := make([]float32, s.M*s.K), make([]float32, s.M*s.N)
			wb, err := Weights(core.F32, s.N, s.K)
			if err != nil {
				return rows, err
			}
			w := core.DecodeF32(wb)
			d, err := Time(ctx, func() error { return o.Harness.SGEMM(s, a, w, c, o.Threads) }, minIters, minTime)
			if err != nil {
				return rows, err
			}
			add(Row{"GEMM " + s.String(), "openblas", s.FLOP() / d.Seconds() / 1e9, "GFLOP/s"})
		}
	}
	shapes := gemv
	if !o.Quick {
		shapes = append(append([]Shape{}, gemv...), ColdShape)
	}
	for _, s := range shapes {
		for _, dt := range GEMVTypes {
			if s == ColdShape && !dt.Quantized() {
				continue // 1 GiB of f32 weights: the quantized ones make the point
			}
			devs := []core.Device{o.Device}
			if o.Ref != nil && s != ColdShape {
				devs = append(devs, o.Ref)
			}
			for _, dev := range devs {
				d, err := timeMatMul(dev, s, dt)
				if err != nil {
					return rows, err
				}
				add(Row{fmt.Sprintf("GEMV %s %s", s, dt), dev.Info().ID(),
					float64(dt.Bytes(s.N*s.K)) / d.Seconds() / 1e9, "GB/s"})
			}
		}
	}
	return rows, nil
}
