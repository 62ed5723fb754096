package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/w8a8"
)

// w8a8Flags are run's W8A8 flags.
type w8a8Flags struct {
	on         *bool
	shadow     *string
	calib      *string
	convert    *bool
	perChannel *bool
}

func addW8A8Flags(fs *flag.FlagSet) *w8a8Flags {
	return &w8a8Flags{
		on: fs.Bool("w8a8", false, "run the layers' projections as per-tensor int8 x int8 MatMuls (the NPU's part) with shadow outliers (the CPU's part); "+
			"needs a calibration (xpu calibrate) and int8 weights (xpu quantize --npu-int8, or --w8a8-convert); with --units qnn,neon the int8 work goes to qnn and the shadow work to neon"),
		shadow:     fs.String("shadow", "pruned", "with --w8a8: shadow outlier path on every layer (on), on the layers calibration kept (pruned) or none (off)"),
		calib:      fs.String("calib", "", "with --w8a8: calibration file (default: the cache's for this model)"),
		convert:    fs.Bool("w8a8-convert", false, "with --w8a8: quantize the weights to int8 at load time when the file has none"),
		perChannel: fs.Bool("w8a8-per-channel", false, "with --w8a8-convert: per-output-channel weight scales"),
	}
}

// check validates the flags before the model loads.
func (f *w8a8Flags) check() error {
	if _, err := w8a8.ParseShadowMode(*f.shadow); err != nil {
		return fmt.Errorf("--shadow %q: must be on, off or pruned", *f.shadow)
	}
	if !*f.on && (*f.calib != "" || *f.convert || *f.perChannel) {
		return errors.New("--calib, --w8a8-convert and --w8a8-per-channel go with --w8a8")
	}
	return nil
}

// lowering loads the calibration and lowers m (nil without --w8a8).
func (f *w8a8Flags) lowering(m *llm.Model, stderr io.Writer) (*w8a8.Lowering, error) {
	if !*f.on {
		return nil, nil
	}
	path := *f.calib
	if path == "" {
		var err error
		if path, err = w8a8.CachePath(w8a8.ModelKey(m.File)); err != nil {
			return nil, err
		}
	}
	cal, err := w8a8.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("--w8a8: no calibration for this model at %s (run xpu calibrate --model MODEL first, or give --calib FILE): %w", path, err)
	}
	if err != nil {
		return nil, err
	}
	mode, _ := w8a8.ParseShadowMode(*f.shadow)
	gran := w8a8.PerTensor
	if *f.perChannel {
		gran = w8a8.PerChannel
	}
	w, err := w8a8.NewLowering(m, w8a8.Config{Calibration: cal, Shadow: mode, Convert: *f.convert, Granularity: gran})
	if err != nil {
		if errors.Is(err, w8a8.ErrNoInt8) {
			err = fmt.Errorf("%w (or pass --w8a8-convert)", err)
		}
		return nil, err
	}
	fmt.Fprintf(stderr, "w8a8: %s\n", w.Describe())
	return w, nil
}
