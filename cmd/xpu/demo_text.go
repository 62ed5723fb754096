package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
	"github.com/xpuhub/xpu/sched"
)

// defaultDemoModel is the test model, where the repository's sibling folder holds it.
const defaultDemoModel = "../shared/models/stories260K.gguf"

// demoText generates text with one model across every usable unit (each device of backends
// except the reference, with the default plan) and prints the placement and each unit's busy
// time. Without the test model it writes a synthetic one and says so.
func demoText(ctx context.Context, stdout io.Writer, backends []core.Backend, modelPath string, n int) error {
	if modelPath == "" {
		dir, err := os.MkdirTemp("", "xpu-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		modelPath = filepath.Join(dir, "synthetic.gguf")
		if err := writeSynthModel(modelPath); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "(the test model %s is absent: a synthetic model with random weights generates noise)\n",
			defaultDemoModel)
	}
	m, err := llm.Open(modelPath)
	if err != nil {
		return err
	}
	defer m.Close()
	var devs []core.Device
	var specs []sched.UnitSpec
	for _, b := range backends {
		for _, d := range b.Devices() {
			devs = append(devs, d)
			info := d.Info()
			specs = append(specs, sched.UnitSpec{Backend: info.Backend, Index: info.Index})
		}
	}
	if len(specs) == 0 {
		return fmt.Errorf("no plugin device to run on: %w", core.ErrNotFound)
	}
	plan, err := llm.DefaultPlan(m, devs, specs)
	if err != nil {
		return err
	}
	r, err := llm.NewPlannedRunner(ctx, m, devs, plan, llm.WithChunkSize(8))
	if err != nil {
		return err
	}
	defer r.Close()
	prompt := "Once upon a time, there was a little girl named Lily."
	t0 := time.Now()
	res, err := r.Generate(ctx, prompt, llm.WithMaxTokens(n))
	if err != nil {
		return err
	}
	took := time.Since(t0)
	fmt.Fprintf(stdout, "text generation: %s (%d layers) across %s, default plan (sched/PLAN.md)\n",
		filepath.Base(modelPath), m.Config.Layers, strings.Join(taggedUnits(r.Units(), devs, specs), ", "))
	fmt.Fprintf(stdout, "placement:\n%s\n\n", r.Placement())
	fmt.Fprintf(stdout, "%s%s\n\n", prompt, res.Text)
	fmt.Fprintf(stdout, "%d prompt tokens, %d generated in %.0f ms; busy time per unit:\n%s\n", res.PromptTokens,
		len(res.Tokens), float64(took)/float64(time.Millisecond), r.Report())
	return nil
}

// taggedUnits labels each unit with its device's kind, and says "emulated" where the device is
// (the QNN provider here), so no demo line passes an emulator off as hardware.
func taggedUnits(units []string, devs []core.Device, specs []sched.UnitSpec) []string {
	out := make([]string, len(units))
	for i, u := range units {
		out[i] = u
		for j, s := range specs {
			if s.String() == u {
				out[i] = fmt.Sprintf("%s (%s)", u, deviceTag(devs[j].Info()))
				break
			}
		}
	}
	return out
}

// writeSynthModel writes the small generated Llama model.
func writeSynthModel(path string) error {
	spec, err := synth.Preset("llama", "260K", core.F32, 1)
	if err != nil {
		return err
	}
	return synth.WriteFile(path, spec)
}
