package abi

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// validated opens the test plugin built with defines and returns its raw validated Calls, for
// the host-side misuse no adapter lets through.
func validated(t *testing.T, defines ...string) *Validator {
	t.Helper()
	p, err := Open(plugintest.Plugin(t, defines...))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	di, st := p.DeviceInfo(0)
	require.Equal(t, StatusOK, st)
	return NewValidator(NewPluginCalls(p), "testplugin", []core.DeviceInfo{di})
}

// validatedBackend opens the test plugin built with defines as a core.Backend with the
// validation layer.
func validatedBackend(t *testing.T, defines ...string) core.Context {
	t.Helper()
	p, err := Open(plugintest.Plugin(t, defines...))
	require.NoError(t, err)
	be, err := NewBackend(p, WithValidation())
	require.NoError(t, err)
	t.Cleanup(func() { be.Close() })
	cx, err := be.Devices()[0].NewContext(context.Background(), nil)
	require.NoError(t, err)
	return cx
}

// addIR is ADD of two f32 [16] inputs: 64 bytes per io.
func addIR(t *testing.T) []byte {
	t.Helper()
	g := core.NewGraph()
	g.Output(g.Add(g.Input("a", core.F32, 16), g.Input("b", core.F32, 16)))
	ir, err := EncodeGraph(g, nil)
	require.NoError(t, err)
	return ir
}

// prepared makes a context, an ADD executable and an execution of it through v.
func prepared(t *testing.T, v *Validator) (cx, ex uint64) {
	t.Helper()
	cx, err := v.ContextCreate(context.Background(), 0, "")
	require.NoError(t, err)
	return cx, preparedIn(t, v, cx)
}

// preparedIn makes an ADD executable in context cx and an execution of it.
func preparedIn(t *testing.T, v *Validator, cx uint64) (ex uint64) {
	t.Helper()
	ctx := context.Background()
	ir := addIR(t)
	_, err := v.GraphAnalyze(ctx, cx, ir, 1)
	require.NoError(t, err)
	exe, err := v.GraphPrepare(ctx, cx, ir, "", nil)
	require.NoError(t, err)
	ex, err = v.ExecutionCreate(exe)
	require.NoError(t, err)
	return ex
}

func runAdd(ctx context.Context, cx core.Context, op func(*core.Graph, *core.Tensor, *core.Tensor) *core.Tensor) error {
	g := core.NewGraph()
	g.Output(op(g, g.Input("a", core.F32, 33), g.Input("b", core.F32, 33)))
	exe, err := cx.Prepare(ctx, g)
	if err != nil {
		return err
	}
	defer exe.Close()
	x, err := exe.NewExecution()
	if err != nil {
		return err
	}
	defer x.Close()
	var bufs []core.Buffer
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()
	for io := range 3 {
		b, err := cx.Alloc(33*4, core.BufferDevice)
		if err != nil {
			return err
		}
		bufs = append(bufs, b)
		vals := make([]float32, 33)
		for i := range vals {
			vals[i] = float32(io+1) * (0.1 + float32(i)*0.731)
		}
		if err := b.Write(0, core.EncodeF32(vals)); err != nil {
			return err
		}
		if err := x.Bind(io, b, 0); err != nil {
			return err
		}
	}
	return x.Run(ctx)
}

// Every rule is caught at the call that broke it, by the host or by the plugin, and names the
// call; each scenario also runs on the intact plugin (or correctly), where nothing is caught.
func TestValidationCatches(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		mutant string // the plugin's mutation; "" = intact, the misuse is the host's
		rule   Rule
		call   string
		plugin bool
		// misuse breaks the rule; right is the same scenario done right (nil: misuse on the
		// intact plugin is the right version)
		misuse func(t *testing.T, v *Validator) error
		right  func(t *testing.T, v *Validator) error
	}{
		{
			name: "use-after-release", rule: RuleHandleLifetime, call: "buffer_write",
			misuse: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				b, err := v.BufferAlloc(cx, 64, core.BufferDevice)
				require.NoError(t, err)
				require.NoError(t, v.BufferRelease(b))
				return v.BufferWrite(b, 0, make([]byte, 8))
			},
			right: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				b, err := v.BufferAlloc(cx, 64, core.BufferDevice)
				require.NoError(t, err)
				defer v.BufferRelease(b)
				return v.BufferWrite(b, 0, make([]byte, 8))
			},
		},
		{
			name: "use-after-release-bound", rule: RuleHandleLifetime, call: "execution_run",
			misuse: func(t *testing.T, v *Validator) error {
				cx, ex := prepared(t, v)
				for io := range uint32(3) {
					b, err := v.BufferAlloc(cx, 64, core.BufferDevice)
					require.NoError(t, err)
					require.NoError(t, v.ExecutionBind(ex, io, b, 0))
					if io == 1 {
						require.NoError(t, v.BufferRelease(b))
					}
				}
				return v.ExecutionRun(ctx, ex, nil)
			},
		},
		{
			name: "out-of-bounds-binding", rule: RuleBufferBounds, call: "execution_bind",
			misuse: func(t *testing.T, v *Validator) error {
				cx, ex := prepared(t, v)
				b, err := v.BufferAlloc(cx, 96, core.BufferDevice)
				require.NoError(t, err)
				return v.ExecutionBind(ex, 2, b, 40) // 64 bytes from 40 of 96
			},
			right: func(t *testing.T, v *Validator) error {
				cx, ex := prepared(t, v)
				b, err := v.BufferAlloc(cx, 96, core.BufferDevice)
				require.NoError(t, err)
				return v.ExecutionBind(ex, 2, b, 32)
			},
		},
		{
			name: "out-of-bounds-constant", rule: RuleBufferBounds, call: "graph_analyze",
			misuse: func(t *testing.T, v *Validator) error {
				return analyzeConstAt(t, v, 8)
			},
			right: func(t *testing.T, v *Validator) error {
				return analyzeConstAt(t, v, 0)
			},
		},
		{
			name: "fence-backwards-host", rule: RuleFenceOrder, call: "fence_signal",
			misuse: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				f, err := v.FenceCreate(cx, 0)
				require.NoError(t, err)
				require.NoError(t, v.FenceSignal(f, 5))
				return v.FenceSignal(f, 3)
			},
			right: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				f, err := v.FenceCreate(cx, 0)
				require.NoError(t, err)
				require.NoError(t, v.FenceSignal(f, 3))
				return v.FenceSignal(f, 5)
			},
		},
		{
			name: "fence-backwards-plugin", mutant: "MUT_FENCE_BACK", rule: RuleFenceOrder, call: "fence_value", plugin: true,
			misuse: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				f, err := v.FenceCreate(cx, 0)
				require.NoError(t, err)
				require.NoError(t, v.FenceSignal(f, 5))
				_, err = v.FenceValue(f)
				return err
			},
		},
		{
			name: "prepare-after-analyze", mutant: "MUT_REFUSE", rule: RuleAnalyzePrepare, call: "graph_prepare", plugin: true,
			misuse: func(t *testing.T, v *Validator) error {
				cx, err := v.ContextCreate(ctx, 0, "")
				require.NoError(t, err)
				g := core.NewGraph()
				g.Output(g.Exp(g.Input("x", core.F32, 7)))
				ir, err := EncodeGraph(g, nil)
				require.NoError(t, err)
				vs, err := v.GraphAnalyze(ctx, cx, ir, 1)
				require.NoError(t, err)
				require.Equal(t, core.VerdictYes, vs[0].Verdict)
				_, err = v.GraphPrepare(ctx, cx, ir, "", nil)
				return err
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var defines []string
			if tt.mutant != "" {
				defines = append(defines, tt.mutant)
			}
			err := tt.misuse(t, validated(t, defines...))
			require.Error(t, err, "the broken rule went unnoticed")
			assert.ErrorIs(t, err, ErrValidation)
			assert.ErrorIs(t, err, tt.rule)
			var viol *Violation
			require.ErrorAs(t, err, &viol)
			assert.Equal(t, tt.call, viol.Call)
			assert.Equal(t, tt.plugin, viol.Plugin)
			assert.Contains(t, err.Error(), tt.call)
			assert.Contains(t, err.Error(), string(tt.rule))

			right := tt.right
			if right == nil {
				right = tt.misuse
			}
			if tt.right != nil || tt.mutant != "" {
				assert.NoError(t, right(t, validated(t)), "a false alarm on the intact plugin")
			}
		})
	}
}

// A plugin that computes ADD at half precision while it reports F32 is caught on the
// executable's first run through the adapter; the intact plugin is not, nor an op the mutant
// leaves alone.
func TestValidationCatchesWrongPrecision(t *testing.T) {
	ctx := context.Background()
	add := func(g *core.Graph, a, b *core.Tensor) *core.Tensor { return g.Add(a, b) }
	mul := func(g *core.Graph, a, b *core.Tensor) *core.Tensor { return g.Mul(a, b) }

	err := runAdd(ctx, validatedBackend(t, "MUT_HALF_PRECISION"), add)
	require.Error(t, err)
	assert.ErrorIs(t, err, RulePrecision)
	assert.Contains(t, err.Error(), "execution_run")
	assert.Contains(t, err.Error(), "f32")

	assert.NoError(t, runAdd(ctx, validatedBackend(t, "MUT_HALF_PRECISION"), mul))
	assert.NoError(t, runAdd(ctx, validatedBackend(t), add))
}

// The same prepare-after-analyze mutant seen through the adapter: the error a caller of
// Context.Prepare gets names the rule.
func TestValidationThroughTheAdapter(t *testing.T) {
	g := core.NewGraph()
	g.Output(g.Exp(g.Input("x", core.F32, 7)))
	_, err := validatedBackend(t, "MUT_REFUSE").Prepare(context.Background(), g)
	require.Error(t, err)
	assert.ErrorIs(t, err, RuleAnalyzePrepare)
	assert.NotErrorIs(t, err, RulePrecision)
}

// blockingRun is a Calls whose execution_run waits until release is closed, so a test can
// make calls while a run is in flight on another goroutine.
type blockingRun struct {
	Calls
	started chan struct{}
	release chan struct{}
}

func (b *blockingRun) ExecutionRun(ctx context.Context, ex uint64, hist *RunHistory) error {
	close(b.started)
	<-b.release
	return b.Calls.ExecutionRun(ctx, ex, hist)
}

// An execution bound or released while another goroutine runs it, and a second execution run
// at the same time on a device without XPU_CAP_CONCURRENT, break the threading rule.
func TestValidationThreading(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		concurrent bool
		during     func(v *Validator, cx, ex, ex2, buf uint64) error
		call       string
	}{
		{"bind while running", true, func(v *Validator, cx, ex, ex2, buf uint64) error {
			return v.ExecutionBind(ex, 0, buf, 0)
		}, "execution_bind"},
		{"release while running", true, func(v *Validator, cx, ex, ex2, buf uint64) error {
			return v.ExecutionRelease(ex)
		}, "execution_release"},
		{"release a bound buffer while running", true, func(v *Validator, cx, ex, ex2, buf uint64) error {
			return v.BufferRelease(buf)
		}, "buffer_release"},
		{"second run on a device without concurrency", false, func(v *Validator, cx, ex, ex2, buf uint64) error {
			return v.ExecutionRun(ctx, ex2, nil)
		}, "execution_run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Open(plugintest.Plugin(t))
			require.NoError(t, err)
			defer p.Close()
			di, st := p.DeviceInfo(0)
			require.Equal(t, StatusOK, st)
			if !tt.concurrent {
				di.Caps &^= core.CapConcurrent
			}
			br := &blockingRun{Calls: NewPluginCalls(p), started: make(chan struct{}), release: make(chan struct{})}
			v := NewValidator(br, "testplugin", []core.DeviceInfo{di})
			cx, ex := prepared(t, v)
			ex2 := preparedIn(t, v, cx)
			for io := range uint32(3) {
				for _, x := range []uint64{ex, ex2} {
					b, err := v.BufferAlloc(cx, 64, core.BufferDevice)
					require.NoError(t, err)
					require.NoError(t, v.ExecutionBind(x, io, b, 0))
				}
			}
			// the buffer of io 0 of ex: the one released while it runs
			bufOfEx := v.objs[vkey{kExecution, ex}].binds[0]
			done := make(chan error, 1)
			go func() { done <- v.ExecutionRun(ctx, ex, nil) }()
			<-br.started
			err = tt.during(v, cx, ex, ex2, bufOfEx)
			close(br.release)
			require.NoError(t, <-done)
			require.Error(t, err)
			assert.ErrorIs(t, err, RuleThreading)
			var viol *Violation
			require.ErrorAs(t, err, &viol)
			assert.Equal(t, tt.call, viol.Call)
		})
	}
}

// A violation wraps ErrValidation and its rule only, not the plugin's status: a caller that
// falls back on ErrUnsupported does not silently fall back over a broken rule.
func TestViolationError(t *testing.T) {
	v := &Violation{Backend: "b", Call: "graph_prepare", Rule: RuleAnalyzePrepare, Plugin: true, Detail: "x"}
	assert.ErrorIs(t, v, ErrValidation)
	assert.ErrorIs(t, v, RuleAnalyzePrepare)
	assert.False(t, errors.Is(v, core.ErrUnsupported))
	assert.Equal(t, "validate: b graph_prepare: rule analyze-prepare broken by the plugin answer: x", v.Error())
}

// readIR reads the io sizes and constant locations the checks need, and gives up (leaving the
// IR to the plugin) on a blob it cannot read.
func TestReadIR(t *testing.T) {
	g := core.NewGraph()
	w := g.Const("w", core.Q4_0, core.Shape{4, 64}, make([]byte, core.Q4_0.Bytes(4*64)))
	g.Output(g.MatMul(g.Input("x", core.F32, 3, 64), w))
	ir, err := EncodeGraph(g, func(*core.Tensor) (ConstRef, error) { return ConstRef{Buffer: 7, Offset: 36}, nil })
	require.NoError(t, err)
	view, ok := readIR(ir)
	require.True(t, ok)
	assert.Equal(t, []uint64{3 * 64 * 4, 3 * 4 * 4}, view.ios)
	assert.Equal(t, 1, view.nIn)
	require.Len(t, view.consts, 1)
	assert.Equal(t, irConst{tensor: 0, buf: 7, off: 36, bytes: uint64(core.Q4_0.Bytes(4 * 64))}, view.consts[0])

	for _, bad := range [][]byte{nil, ir[:40], append([]byte{0}, ir[1:]...)} {
		_, ok := readIR(bad)
		assert.False(t, ok)
	}
}

// analyzeConstAt analyzes x + c with c, 16 f32 values, at offset off of a 64-byte buffer.
func analyzeConstAt(t *testing.T, v *Validator, off uint64) error {
	ctx := context.Background()
	cx, err := v.ContextCreate(ctx, 0, "")
	require.NoError(t, err)
	buf, err := v.BufferAlloc(cx, 64, core.BufferDevice)
	require.NoError(t, err)
	g := core.NewGraph()
	g.Output(g.Add(g.Input("x", core.F32, 16), g.Const("c", core.F32, core.Shape{16}, make([]byte, 64))))
	ir, err := EncodeGraph(g, func(*core.Tensor) (ConstRef, error) { return ConstRef{Buffer: buf, Offset: off}, nil })
	require.NoError(t, err)
	_, err = v.GraphAnalyze(ctx, cx, ir, 1)
	return err
}
