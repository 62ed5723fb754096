package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/profile"
)

// defaultProfileUnits are the units `xpu tune --profile` and `xpu plan` use without --units:
// the three plugins of this repository, each as one unit.
const defaultProfileUnits = "neon,opencl,qnn"

// profileUnits are the units of a profile run: open units and their backends.
type profileUnits struct {
	units    []profile.MeasureUnit
	backends map[string]core.Backend
	open     []*sched.Unit
}

// openProfileUnits opens every unit of list; units that fail to open are reported on stderr
// and left out (a machine without OpenCL still profiles its CPU), unless none opens.
func openProfileUnits(ctx context.Context, list string, stderr io.Writer) (*profileUnits, error) {
	specs, err := sched.ParseUnitList(list)
	if err != nil {
		return nil, err
	}
	pu := &profileUnits{backends: map[string]core.Backend{}}
	backendErr := map[string]error{}
	for _, spec := range specs {
		u, _, err := openUnit(ctx, spec, pu.backends, backendErr)
		if err != nil {
			fmt.Fprintf(stderr, "xpu: unit %s left out: %v\n", spec, err)
			continue
		}
		pu.open = append(pu.open, u)
		pu.units = append(pu.units, profile.MeasureUnit{Unit: u, Build: pu.backends[spec.Backend].Info().BuildID})
	}
	if len(pu.units) == 0 {
		pu.close()
		return nil, fmt.Errorf("none of the units %s opened: %w", list, core.ErrNotFound)
	}
	return pu, nil
}

func (pu *profileUnits) close() {
	for _, u := range slices.Backward(pu.open) {
		_ = u.Close()
	}
	for _, b := range pu.backends {
		b.Close()
	}
}

// unitsOf are the profile units of the open units, for the cache key (no entries).
func (pu *profileUnits) keyUnits() []profile.Unit {
	out := make([]profile.Unit, len(pu.units))
	for i, mu := range pu.units {
		out[i] = profile.Unit{Name: mu.Unit.Name(), Build: mu.Build, Device: mu.Unit.Device().Info().Name}
	}
	return out
}

// modelShape is the cost shape of a loaded GGUF model: its config, the weight type of layer 0's
// projections and of the output head.
func modelShape(path string, m *llm.Model) profile.Model {
	c := m.Config
	md := profile.Model{Name: filepath.Base(path), Layers: c.Layers, Dim: c.Dim, FFN: c.FFN, Heads: c.Heads,
		KVHeads: c.KVHeads, HeadDim: c.HeadDim, Vocab: c.Vocab, DType: "f32"}
	if t, ok := m.File.Tensor("blk.0.attn_q.weight"); ok {
		md.DType = t.DType.String()
	}
	head := "output.weight"
	if _, ok := m.File.Tensor(head); !ok {
		head = "token_embd.weight" // tied embeddings
	}
	if t, ok := m.File.Tensor(head); ok && t.DType.String() != md.DType {
		md.OutputDType = t.DType.String()
	}
	return md
}

// layerWeights returns a projection's weight bytes from the model file (layer 0's, or the
// head's), for Measure to time the real data.
func layerWeights(m *llm.Model) func(profile.MatMul) []byte {
	return func(mm profile.MatMul) []byte {
		name := "blk.0." + mm.Name + ".weight"
		if mm.Name == "logits" {
			name = "output.weight"
			if _, ok := m.File.Tensor(name); !ok {
				name = "token_embd.weight"
			}
		}
		t, ok := m.File.Tensor(name)
		if !ok {
			return nil
		}
		return m.File.TensorData(t)
	}
}

func parseGrid(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1<<16 {
			return nil, fmt.Errorf("--grid %q: row counts from 1 to 65536, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// tuneProfile is `xpu tune --profile`: it measures every op class of the model on every unit
// and stores the profile under the cache dir (keyed by the units' plugin builds, devices and
// options, the model's shapes and the grid).
func tuneProfile(ctx context.Context, model, units, grid, out string, minTime time.Duration, noCache bool, stdout, stderr io.Writer) error {
	g, err := parseGrid(grid)
	if err != nil {
		return err
	}
	// where the profile goes must take it before minutes of measuring, not after
	if out != "" {
		if err := checkWritableDir(filepath.Dir(out)); err != nil {
			return fmt.Errorf("-o %s: %w", out, err)
		}
	}
	if !noCache {
		dir, err := profile.CacheDir()
		if err != nil {
			return err
		}
		if err := checkWritableDir(dir); err != nil {
			return fmt.Errorf("the profile cache %w (set XPU_CACHE_DIR, or --no-cache with -o FILE)", err)
		}
	}
	m, err := llm.Open(model)
	if err != nil {
		return err
	}
	defer m.Close()
	pu, err := openProfileUnits(ctx, units, stderr)
	if err != nil {
		return err
	}
	defer pu.close()
	md := modelShape(model, m)
	names := make([]string, len(pu.units))
	for i, u := range pu.units {
		names[i] = u.Unit.Name()
	}
	fmt.Fprintf(stdout, "profiling %s (%d layers, dim %d, ffn %d, %s) on %s, rows %v\n", md.Name, md.Layers, md.Dim, md.FFN,
		md.DType, strings.Join(names, ", "), g)
	start := time.Now()
	p, err := profile.Measure(ctx, pu.units, md, profile.Options{Grid: g, MinTime: minTime, Weights: layerWeights(m),
		Progress: func(s string) { fmt.Fprintf(stdout, "  [%5.1fs] %s\n", time.Since(start).Seconds(), s) }})
	if err != nil {
		return err
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		p.Notes = append(p.Notes, "load average at the end: "+strings.TrimSpace(string(b)))
	}
	fmt.Fprintf(stdout, "measured in %.1f s\n", time.Since(start).Seconds())
	for _, u := range p.Units {
		refused := map[string]bool{}
		for _, e := range u.Entries {
			if e.Refused != "" {
				refused[e.Op+" "+e.DType] = true
			}
		}
		r := ""
		if len(refused) > 0 {
			r = ", refuses " + strings.Join(slices.Sorted(func(yield func(string) bool) {
				for k := range refused {
					if !yield(k) {
						return
					}
				}
			}), ", ")
		}
		fmt.Fprintf(stdout, "  %-28s launch %6.1f µs, weights %5.1f GB/s%s\n", u.Name, u.LaunchSeconds*1e6, u.GBs, r)
	}
	if out != "" {
		b, err := p.Marshal()
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "profile written to %s\n", out)
	}
	if !noCache {
		dir, err := profile.CacheDir()
		if err != nil {
			return err
		}
		path, err := profile.Save(dir, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "stored: %s (xpu plan --model %s finds it)\n", path, model)
	}
	return nil
}

// checkWritableDir makes dir if needed and checks that a file can be created in it.
func checkWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("folder %s cannot be created: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".xpu-write-check-*")
	if err != nil {
		return fmt.Errorf("folder %s is not writable: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}
