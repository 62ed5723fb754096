package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// The reference run against itself must pass everything it runs, and the three reports must
// be well formed.
func TestRunReferencePassesAndWritesReports(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole matrix on the reference: not in -short")
	}
	dir := t.TempDir()
	var progress bytes.Buffer
	opts := []Option{WithReportDir(dir), WithProgress(&progress), WithLevels(2, 3, 4)}
	if raceEnabled {
		opts = append(opts, WithFilter(regexp.MustCompile(`^(BUFFER|GRAPH)|^[A-Z_]+\((dtype=f32|a=f32,b=(f32|q4_0)),[a-z_]+=\[\d{1,2}(,\d{1,2})*\]`)))
	}
	rep, err := Run(context.Background(), ref.New(), opts...)
	require.NoError(t, err)
	assert.Zero(t, rep.Failed, "failures: %v", rep.Failures())
	if !raceEnabled {
		assert.Greater(t, rep.Passed, 500)
	}
	assert.Contains(t, progress.String(), "MATMUL(a=f32,b=q4_0")

	raw, err := os.ReadFile(filepath.Join(dir, "ref.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(raw, &back))
	assert.Equal(t, rep.Passed, back.Passed)
	assert.Len(t, back.Cases, len(rep.Cases))

	raw, err = os.ReadFile(filepath.Join(dir, "ref.xml"))
	require.NoError(t, err)
	var suites junitSuites
	require.NoError(t, xml.Unmarshal(raw, &suites))
	require.Len(t, suites.Suites, 2, "the cases, then the levels")
	assert.Equal(t, len(rep.Cases), suites.Suites[0].Tests)
	assert.Equal(t, "xpu-conformance-levels.ref", suites.Suites[1].Name)

	raw, err = os.ReadFile(filepath.Join(dir, "ref.md"))
	require.NoError(t, err)
	assert.Contains(t, string(raw), "| MATMUL | f32/q4_0 | ✓")
	assert.Contains(t, string(raw), rep.Summary())
}

// perturb returns a reference that differs from core/ref in the outputs of nodes of op: the
// backend (the reference itself) then looks wrong, which the suite must report.
func perturb(op core.Op, f func(out []byte)) ReferenceFunc {
	return func(ctx context.Context, g *core.Graph, in [][]byte) ([][]byte, error) {
		outs, err := ref.Run(ctx, g, in)
		if err != nil {
			return nil, err
		}
		for i, t := range g.Outputs {
			if t.Producer >= 0 && g.Nodes[t.Producer].Op == op {
				f(outs[i])
			}
		}
		return outs, nil
	}
}

func TestRunCatchesADifferentReference(t *testing.T) {
	tests := []struct {
		name   string
		filter string
		op     core.Op
		f      func([]byte)
		cat    Category
	}{
		{"one bit of a permute", `^PERMUTE\(dtype=f32,shape=\[2,3\]`, core.OpPermute,
			func(b []byte) { b[0] ^= 1 }, CatMismatch},
		{"a NaN where the backend is finite", `^SOFTMAX\(dtype=f32,shape=\[3,17\]`, core.OpSoftmax,
			func(b []byte) { copy(b, core.EncodeF32([]float32{float32(nanF())})) }, CatNaN},
		{"matmul scaled by 1.01", `^MATMUL\(a=f32,b=f32,a_shape=\[5,7\]`, core.OpMatMul,
			func(b []byte) {
				xs := core.DecodeF32(b)
				for i := range xs {
					xs[i] *= 1.01
				}
				copy(b, core.EncodeF32(xs))
			}, CatMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Run(context.Background(), ref.New(), WithFilter(regexp.MustCompile(tt.filter)),
				WithReference(perturb(tt.op, tt.f)), WithSeed(7))
			require.NoError(t, err)
			require.NotEmpty(t, rep.Cases)
			for _, c := range rep.Cases {
				assert.Equal(t, StatusFail, c.Status, c.Name)
				assert.Equal(t, tt.cat, c.Category, "%s: %v", c.Name, c.Errors)
				assert.Contains(t, c.Repro, "--seed 7")
				assert.Regexp(t, `--filter '\^`, c.Repro)
			}
		})
	}
}

func nanF() float64 { return math.NaN() }

func TestRunRejectsBadArguments(t *testing.T) {
	_, err := Run(context.Background(), nil)
	assert.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = Run(context.Background(), ref.New(), WithDevice(3))
	assert.ErrorIs(t, err, core.ErrNotFound)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Run(ctx, ref.New(), WithFilter(regexp.MustCompile(`^RELU`)))
	assert.ErrorIs(t, err, context.Canceled)
}

func TestLevelOneSkipsWithoutAPlugin(t *testing.T) {
	rep, err := Run(context.Background(), ref.New(), WithLevels(1))
	require.NoError(t, err)
	require.NotEmpty(t, rep.Cases)
	for _, c := range rep.Cases {
		assert.Equal(t, StatusSkipped, c.Status, c.Name)
	}
	assert.Equal(t, "0 passed, 0 failed, 0 unsupported", rep.Summary())
}

func TestModelCaseHook(t *testing.T) {
	cases := []struct {
		mc     ModelCase
		status Status
		cat    Category
	}{
		{ModelCase{Name: "test-pass", Run: func(context.Context, core.Device) (ModelResult, error) {
			return ModelResult{NMSE: 1e-9, Detail: "once upon a time"}, nil
		}}, StatusPass, CatNone},
		{ModelCase{Name: "test-skip", Run: func(context.Context, core.Device) (ModelResult, error) {
			return ModelResult{}, errors.Join(ErrSkip, errors.New("../shared/models/stories260K.gguf is absent"))
		}}, StatusSkipped, CatNone},
		{ModelCase{Name: "test-mismatch", Run: func(context.Context, core.Device) (ModelResult, error) {
			return ModelResult{NMSE: 0.5}, errors.Join(ErrMismatch, errors.New("greedy text differs at token 3"))
		}}, StatusFail, CatMismatch},
		{ModelCase{Name: "test-unsupported", Run: func(context.Context, core.Device) (ModelResult, error) {
			return ModelResult{}, core.ErrUnsupported
		}}, StatusUnsupported, CatNone},
	}
	for _, c := range cases {
		require.NoError(t, RegisterModelCase(c.mc))
	}
	t.Cleanup(func() {
		models.Lock()
		defer models.Unlock()
		for _, c := range cases {
			delete(models.cases, c.mc.Name)
		}
	})
	assert.Error(t, RegisterModelCase(cases[0].mc), "duplicate")
	assert.Error(t, RegisterModelCase(ModelCase{Name: "x"}), "no Run")

	rep, err := Run(context.Background(), ref.New(), WithFilter(regexp.MustCompile(`^MODEL\(test-`)))
	require.NoError(t, err)
	require.Len(t, rep.Cases, len(cases))
	for _, c := range cases {
		got, ok := rep.Case("MODEL(" + c.mc.Name + ")")
		require.True(t, ok, c.mc.Name)
		assert.Equal(t, c.status, got.Status, c.mc.Name)
		assert.Equal(t, c.cat, got.Category, c.mc.Name)
		assert.Equal(t, 5, got.Level)
	}
}

func TestReportFolderErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err := Run(context.Background(), ref.New(), WithFilter(regexp.MustCompile(`^NEG\(dtype=f32,shape=\[1\]\)$`)),
		WithReportDir(filepath.Join(file, "reports")))
	assert.Error(t, err, "a report folder under a file cannot be made")

	rep := &Report{Backend: BackendRecord{Name: "we/ird name"}, Device: DeviceRecord{Index: 2}}
	assert.Equal(t, "we_ird_name-2", rep.FileBase())
}
