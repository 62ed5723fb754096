package llmconform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// TestStoriesCases runs the stories260K cases on the NEON plugin when it is built (fast; the
// llm package's tests already run the same greedy generation on ref) and on ref otherwise.
func TestStoriesCases(t *testing.T) {
	if _, err := ModelsDir(); errors.Is(err, conformance.ErrSkip) {
		t.Skip(err)
	}
	b, err := loader.Open(context.Background(), "neon")
	if err != nil {
		t.Logf("neon plugin not built (%v): using ref", err)
		b = ref.New()
	}
	defer b.Close()
	dev := b.Devices()[0]
	res, err := greedyCase(context.Background(), dev)
	require.NoError(t, err)
	assert.Less(t, res.NMSE, 1e-6)
	res, err = quantCase(context.Background(), dev, core.Q8_0)
	require.NoError(t, err)
	t.Log(res.Detail)
	assert.Greater(t, res.NMSE, 0.0)
}

// TestSyntheticCaseCatchesWrongLogits: the case on ref compares ref with itself (NMSE 0 by
// construction), so the comparison is checked on a device whose logits are planted wrong (every
// logit + 1: greedy text would not change, the logits comparison must) and on the neon plugin,
// whose arithmetic differs from ref's.
func TestSyntheticCaseCatchesWrongLogits(t *testing.T) {
	ctx := context.Background()
	b := ref.New()
	defer b.Close()
	_, err := synthCase(ctx, fakeDevice{Device: b.Devices()[0], mode: "shift"})
	require.ErrorIs(t, err, conformance.ErrMismatch)

	nb, err := loader.Open(ctx, "neon")
	if err != nil {
		required.Skip(t, "neon", "neon plugin not built: %v", err)
	}
	defer nb.Close()
	res, err := synthCase(ctx, nb.Devices()[0])
	require.NoError(t, err)
	assert.Positive(t, res.NMSE, "neon quantizes activations: its logits are not ref's bit for bit")
	assert.Less(t, res.NMSE, synthNMSEBound)
}

// TestModelCaseRefusalCategories: a device that refuses a node in analysis makes the model case
// unsupported; one that accepts every node and then refuses at prepare fails it as a capability
// lie (it used to be counted as unsupported, since the runner prepared without analyzing).
func TestModelCaseRefusalCategories(t *testing.T) {
	ctx := context.Background()
	b := ref.New()
	defer b.Close()
	for _, tc := range []struct {
		mode   string
		status conformance.Status
		cat    conformance.Category
	}{
		{"none", conformance.StatusPass, conformance.CatNone},
		{"refuse", conformance.StatusUnsupported, conformance.CatNone},
		{"lie", conformance.StatusFail, conformance.CatCapabilityLie},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			fb := fakeBackend{Backend: b, dev: fakeDevice{Device: b.Devices()[0], mode: tc.mode}}
			rep, err := conformance.Run(ctx, fb, conformance.WithFilter(regexp.MustCompile(`^MODEL\(synthetic`)))
			require.NoError(t, err)
			require.Len(t, rep.Cases, 1)
			c := rep.Cases[0]
			assert.Equal(t, tc.status, c.Status, "%s %v", c.Reason, c.Errors)
			assert.Equal(t, tc.cat, c.Category)
		})
	}
}

// fakeBackend, fakeDevice and fakeContext plant faults in front of a real device: "refuse"
// refuses every node in analysis, "lie" accepts in analysis and refuses at prepare, "shift"
// adds 1 to every logit the model's output stage computes.
type fakeBackend struct {
	core.Backend
	dev core.Device
}

func (b fakeBackend) Devices() []core.Device { return []core.Device{b.dev} }

type fakeDevice struct {
	core.Device
	mode string
}

func (d fakeDevice) NewContext(ctx context.Context, o map[string]string) (core.Context, error) {
	c, err := d.Device.NewContext(ctx, o)
	if err != nil {
		return nil, err
	}
	return fakeContext{Context: c, mode: d.mode}, nil
}

type fakeContext struct {
	core.Context
	mode string
}

func (c fakeContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if c.mode == "refuse" {
		v := make([]core.NodeVerdict, len(g.Nodes))
		for i := range v {
			v[i].Reason = "planted refusal"
		}
		return v, nil
	}
	return c.Context.Analyze(ctx, g)
}

func (c fakeContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	if c.mode == "lie" {
		return nil, fmt.Errorf("planted refusal after analysis: %w", core.ErrUnsupported)
	}
	e, err := c.Context.Prepare(ctx, g, opts...)
	if err != nil || c.mode != "shift" || len(g.Outputs) != 1 {
		return e, err
	}
	return shiftExecutable{Executable: e, nIn: len(g.Inputs)}, nil
}

type shiftExecutable struct {
	core.Executable
	nIn int
}

func (e shiftExecutable) NewExecution() (core.Execution, error) {
	x, err := e.Executable.NewExecution()
	return &shiftExecution{Execution: x, nIn: e.nIn}, err
}

type shiftExecution struct {
	core.Execution
	nIn int
	out core.Buffer
}

func (x *shiftExecution) Bind(io int, buf core.Buffer, off int64) error {
	if io == x.nIn {
		x.out = buf
	}
	return x.Execution.Bind(io, buf, off)
}

func (x *shiftExecution) Run(ctx context.Context) error {
	if err := x.Execution.Run(ctx); err != nil {
		return err
	}
	raw := make([]byte, x.out.Size())
	if err := x.out.Read(0, raw); err != nil {
		return err
	}
	fs := core.DecodeF32(raw)
	for i := range fs {
		fs[i]++
	}
	return x.out.Write(0, core.EncodeF32(fs))
}

func TestModelsDirPrefersTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, storiesFile), nil, 0o600))
	t.Setenv(EnvModels, dir)
	got, err := ModelsDir()
	require.NoError(t, err)
	assert.Equal(t, dir, got)
}

func TestRegistered(t *testing.T) {
	err := conformance.RegisterModelCase(conformance.ModelCase{Name: "stories260K-greedy", Run: greedyCase})
	assert.Error(t, err, "the init registration must have taken the name")
}
