package llm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// ErrNoDevice: no device accepted the model (Load tried every device the policy ranked). It is
// sched.ErrNoDevice.
var ErrNoDevice = sched.ErrNoDevice

type loadConfig struct {
	backend   string
	device    int
	policy    sched.Policy
	allowRef  bool
	source    core.Source
	runnerOps []RunnerOption
	logger    *slog.Logger
}

// LoadOption configures Load.
type LoadOption func(*loadConfig)

// WithBackend runs the model on the named backend ("neon", "opencl", "qnn", "ref" or a plugin
// path) instead of choosing by policy. "ref", the float64 reference, is only ever used when
// named here or allowed by WithReferenceFallback.
func WithBackend(nameOrPath string) LoadOption { return func(c *loadConfig) { c.backend = nameOrPath } }

// WithDevice picks the device index within the backend named by WithBackend (default 0).
func WithDevice(index int) LoadOption { return func(c *loadConfig) { c.device = index } }

// WithPolicy ranks the devices with p instead of sched.MaxPerformance (ignored with
// WithBackend).
func WithPolicy(p sched.Policy) LoadOption { return func(c *loadConfig) { c.policy = p } }

// WithReferenceFallback lets the policy choose the reference backend when no plugin device
// accepts the model. It is slow (float64): without this option Load fails instead.
func WithReferenceFallback() LoadOption { return func(c *loadConfig) { c.allowRef = true } }

// WithSource takes the plugin backends from src (loader.NewSource with discovery options:
// loader.Isolated, loader.WithPaths, ...) instead of the registered source (core.DefaultSource:
// the plugins found with the default options, when the program imports the loader).
func WithSource(src core.Source) LoadOption { return func(c *loadConfig) { c.source = src } }

// WithRunnerOptions passes options to NewRunner (chunk size, context length, KV cache type).
func WithRunnerOptions(opts ...RunnerOption) LoadOption {
	return func(c *loadConfig) { c.runnerOps = append(c.runnerOps, opts...) }
}

// WithLoadLogger sets the logger of Load, the loader and the runner (default slog.Default();
// the library logs nothing above Debug unless something goes wrong).
func WithLoadLogger(l *slog.Logger) LoadOption { return func(c *loadConfig) { c.logger = l } }

// Engine is a model loaded on one device, ready to generate: its Runner (embedded: Generate,
// Prefill, Decode, Reset...) plus the model file and backends it owns, which Close releases.
// Like the Runner it holds one sequence and is not safe for concurrent use; NewRunner gives
// further independent sequences on the same device.
type Engine struct {
	*Runner
	backends []core.Backend
	opts     []RunnerOption
	dev      core.Device // the runner's device, kept for rebuilding it (RebuildRunner)
}

// Load opens the GGUF model at path, chooses a device and prepares the model on it. Without
// options the device is the best usable one in sched.MaxPerformance order (NPU, GPU, then CPU;
// emulated devices after real ones), trying the next when one refuses the model; the
// reference backend is never chosen unless named (WithBackend("ref")) or allowed
// (WithReferenceFallback). The error wraps ErrNoDevice when every ranked device refused.
func Load(ctx context.Context, path string, opts ...LoadOption) (*Engine, error) {
	cfg := loadConfig{policy: sched.MaxPerformance, logger: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.device < 0 {
		return nil, fmt.Errorf("llm: device index %d: %w", cfg.device, core.ErrInvalidArgument)
	}
	if cfg.policy == nil {
		return nil, fmt.Errorf("llm: nil policy: %w", core.ErrInvalidArgument)
	}
	m, err := Open(path)
	if err != nil {
		return nil, err
	}
	ropts := append([]RunnerOption{WithLogger(cfg.logger)}, cfg.runnerOps...)
	r, backends, err := placeModel(ctx, m, &cfg, ropts)
	if err != nil {
		for _, b := range backends {
			_ = b.Close()
		}
		_ = m.Close()
		return nil, err
	}
	cfg.logger.Debug("llm: model loaded", "path", path, "device", r.Device().Info().ID())
	return &Engine{Runner: r, backends: backends, opts: ropts, dev: r.Device()}, nil
}

// placeModel opens the backend(s) and prepares the model on the first device that accepts it.
// Backends that do not hold the runner are closed; the one that does is returned.
func placeModel(ctx context.Context, m *Model, cfg *loadConfig, ropts []RunnerOption) (*Runner, []core.Backend, error) {
	if cfg.backend != "" {
		b, err := core.OpenBackend(ctx, cfg.source, cfg.backend)
		if err != nil {
			return nil, nil, err
		}
		devs := b.Devices()
		if cfg.device >= len(devs) {
			return nil, []core.Backend{b}, fmt.Errorf("llm: backend %s has %d devices, no index %d: %w",
				cfg.backend, len(devs), cfg.device, core.ErrNotFound)
		}
		r, err := NewRunner(ctx, m, devs[cfg.device], ropts...)
		return r, []core.Backend{b}, err
	}
	src := cfg.source
	if src == nil {
		src = core.DefaultSource()
	}
	var extra []string
	if cfg.allowRef {
		extra = append(extra, ref.Name)
	}
	var r *Runner
	_, backends, err := sched.ChooseFrom(ctx, cfg.policy, RepresentativeMatMul(m), src, extra, func(d core.Device) error {
		var err error
		if r, err = NewRunner(ctx, m, d, ropts...); err != nil {
			cfg.logger.Debug("llm: device refused the model", "device", d.Info().ID(), "err", err)
		}
		return err
	})
	if errors.Is(err, sched.ErrNothingListed) && ctx.Err() == nil {
		err = fmt.Errorf("%w (no plugin backend found: build the plugins, set XPU_PLUGIN_PATH, or name \"ref\")", err)
	}
	return r, backends, err
}

// RepresentativeMatMul is the node a policy ranks devices for (sched.Policy.Rank): a matmul
// with the model's weight dtype, the bulk of the work.
func RepresentativeMatMul(m *Model) *core.Node {
	dt := core.F32
	if t, ok := m.File.Tensor("blk.0.ffn_up.weight"); ok {
		dt = t.DType
	}
	g := core.NewGraph()
	k := int64(m.Config.Dim)
	x := g.Input("x", core.F32, 1, k)
	w := g.Const("w", dt, core.Shape{32, k}, make([]byte, dt.Bytes(32*k)))
	g.Output(g.MatMul(x, w))
	if len(g.Nodes) == 0 {
		return &core.Node{Op: core.OpMatMul}
	}
	return g.Nodes[0]
}

// NewRunner prepares another independent sequence (its own KV cache and prepared graphs, and
// so its own copy of the weights on the device) on the engine's device with the engine's
// runner options. The caller closes it before the engine.
func (e *Engine) NewRunner(ctx context.Context) (*Runner, error) {
	return NewRunner(ctx, e.Model(), e.dev, e.opts...)
}

// RunnerOptions are the options the engine's runners are made with (Load's WithRunnerOptions
// and what Load derived), for a runner of another kind on the engine's device.
func (e *Engine) RunnerOptions() []RunnerOption { return slices.Clone(e.opts) }

// Close releases the runner, the model file and the backend.
func (e *Engine) Close() error {
	if e.Runner == nil {
		return nil
	}
	m := e.Model()
	errs := []error{e.Runner.Close(), m.Close()}
	for _, b := range e.backends {
		errs = append(errs, b.Close())
	}
	e.Runner, e.backends = nil, nil
	return errors.Join(errs...)
}
