package coreml

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/cachedir"
)

// EmulatedLabel is how device listings and reports name the emulated Core ML runtime (the
// runtime off Apple systems).
const EmulatedLabel = "coreml (emulated runtime)"

// Name is the backend's name (xpu conform --plugin coreml, llm.WithBackend("coreml")).
const Name = "coreml"

// Caps: host memory throughout (Core ML's MLMultiArray wraps the buffers' bytes), one compiled
// model per static shape.
const baseCaps = core.CapImportHost | core.CapHostVisible | core.CapUnifiedMemory | core.CapStaticShapes |
	core.CapFP16 | core.CapConcurrent

// ErrNoCoreML is returned by Probe and New where Core ML cannot be used.
var ErrNoCoreML = errors.New("coreml: Core ML is not available")

// engine is what runs a package: Core ML itself (darwin) or the emulator (elsewhere).
type engine interface {
	// label names the runtime in device listings and reports.
	label() string
	emulated() bool
	// load compiles (or reuses the compiled form in cacheDir) and loads the package.
	load(ctx context.Context, pkgDir, cacheDir, key string, units string) (model, error)
}

// model is a loaded Core ML model.
type model interface {
	// predict reads inputs and writes outputs in place (bytes by feature name; feats describes
	// every input and output).
	predict(ctx context.Context, feats []feature, in, out map[string][]byte) error
	close() error
}

// Option configures New.
type Option func(*config)

type config struct{ units string }

// WithUnits chooses Core ML's compute units: "cpu", "gpu" (CPU and GPU), "ane" (CPU and Neural
// Engine) or "all" (the default). The emulated runtime accepts and records them; only a Mac runs
// them.
func WithUnits(u string) Option { return func(c *config) { c.units = u } }

// EnvUnits, when set, gives New's default compute units (xpu --coreml-units sets it).
const EnvUnits = "XPU_COREML_UNITS"

// Units are the --coreml-units values.
var Units = []string{"cpu", "gpu", "ane", "all"}

type backend struct {
	closed atomic.Bool
	eng    engine
	units  string
	inner  core.Backend // buffers and fences: plain host memory, as the reference keeps it
	dev    *device
}

type device struct{ b *backend }

// Probe says whether Core ML can run here: a score above 0 and "", or 0 and why not. Linux
// answers 0 ("Core ML exists only on Apple systems"), although New still gives the emulated
// runtime there for conformance and tests.
func Probe() (int, string) { return probe() }

// New opens the backend: Core ML through the Objective-C runtime on darwin, the emulated Core ML
// runtime (package emu) elsewhere. Reports name the emulated one "coreml (emulated runtime)".
func New(opts ...Option) (core.Backend, error) {
	c := config{units: "all"}
	if u := os.Getenv(EnvUnits); u != "" {
		c.units = u
	}
	for _, o := range opts {
		o(&c)
	}
	if !validUnits(c.units) {
		return nil, fmt.Errorf("coreml: compute units %q (want cpu, gpu, ane or all): %w", c.units, core.ErrInvalidArgument)
	}
	eng, err := newEngine()
	if err != nil {
		return nil, err
	}
	b := &backend{eng: eng, units: c.units, inner: ref.New()}
	b.dev = &device{b: b}
	return b, nil
}

func validUnits(u string) bool {
	for _, x := range Units {
		if u == x {
			return true
		}
	}
	return false
}

func (b *backend) Info() core.BackendInfo {
	return core.BackendInfo{
		Name:       Name,
		Vendor:     "Apple (via xpu)",
		Version:    "1",
		BuildID:    fmt.Sprintf("coreml-spec%d-%s-%s", specVersion, opsetName, b.eng.label()),
		SDKVersion: b.eng.label(),
	}
}

func (b *backend) Devices() []core.Device { return []core.Device{b.dev} }

func (b *backend) Close() error {
	b.closed.Store(true)
	return b.inner.Close()
}

func (b *backend) check() error {
	if b.closed.Load() {
		return fmt.Errorf("coreml: the backend is closed: %w", core.ErrInvalidHandle)
	}
	return nil
}

func (d *device) Info() core.DeviceInfo {
	caps := baseCaps
	if d.b.eng.emulated() {
		caps |= core.CapEmulated
	}
	return core.DeviceInfo{
		Backend:      Name,
		Kind:         core.DeviceNPU,
		Caps:         caps,
		Name:         fmt.Sprintf("%s, units %s", d.b.eng.label(), d.b.units),
		Vendor:       "Apple",
		Driver:       fmt.Sprintf("ML Program spec %d (%s)", specVersion, opsetName),
		ComputeUnits: 1,
	}
}

// OpSupport is the static answer; Analyze looks at shapes and constants (MAYBE where they decide).
func (d *device) OpSupport(q core.OpQuery) core.Verdict {
	switch q.Op {
	case core.OpQuantize, core.OpDequantize, core.OpShadowMatMul, core.OpSparseFFN: // the last two: op set 3, not lowered
		return core.VerdictNo
	}
	if q.DTypeIn == core.BF16 || q.DTypeOut == core.BF16 || q.DTypeIn == core.I8 || q.DTypeOut == core.I8 ||
		q.DTypeWeight.KQuant() {
		return core.VerdictNo
	}
	if q.Op >= core.OpAdd && int(q.Op) <= len(core.AllOps()) {
		return core.VerdictMaybe
	}
	return core.VerdictNo
}

func (d *device) NewContext(ctx context.Context, options map[string]string) (core.Context, error) {
	if err := d.b.check(); err != nil {
		return nil, err
	}
	units := d.b.units
	if u, ok := options["units"]; ok {
		if !validUnits(u) {
			return nil, fmt.Errorf("coreml: context option units=%q (want %s): %w", u, strings.Join(Units, ", "), core.ErrInvalidArgument)
		}
		units = u
	}
	inner, err := d.b.inner.Devices()[0].NewContext(ctx, nil)
	if err != nil {
		return nil, err
	}
	c := &cmlContext{dev: d, Context: inner, cacheDir: options["cache_dir"], units: units}
	if c.cacheDir == "" {
		c.cacheDir = defaultCacheDir()
	}
	return c, nil
}

// defaultCacheDir follows every cache's rule (internal/cachedir), with a temporary folder when
// there is no home.
func defaultCacheDir() string {
	if d, err := cachedir.Dir("coreml"); err == nil {
		return d
	}
	return filepath.Join(os.TempDir(), "xpu-coreml-cache")
}

// cmlContext keeps buffers and fences in host memory (the embedded reference context) and
// prepares graphs into Core ML models.
type cmlContext struct {
	core.Context
	dev      *device
	cacheDir string
	// units are Core ML's compute units for what this context prepares: the "units" context
	// option (coreml{units=ane}), else the backend's
	units string
	mu    sync.Mutex
	live  int
}

func (c *cmlContext) Device() core.Device { return c.dev }

func (c *cmlContext) verdicts(g *core.Graph) []core.NodeVerdict {
	v := make([]core.NodeVerdict, len(g.Nodes))
	for i, n := range g.Nodes {
		if why := nodeReason(g, n); why != "" {
			v[i] = core.NodeVerdict{Reason: why}
			continue
		}
		p := core.PrecF32
		// Core ML runs float programs in FP16 on the GPU and the Neural Engine whatever their
		// declared types; the emulator computes what the program declares
		if n.Output.DType == core.F16 || !c.dev.b.eng.emulated() && c.units != "cpu" && n.Output.DType == core.F32 {
			p = core.PrecF16
		}
		v[i] = core.NodeVerdict{Supported: true, Precision: p}
	}
	return v
}

func (c *cmlContext) Analyze(ctx context.Context, g *core.Graph) ([]core.NodeVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("coreml: analyze: %w", err)
	}
	if err := c.dev.b.check(); err != nil {
		return nil, err
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("coreml: analyze: %w", err)
	}
	return c.verdicts(g), nil
}

// Prepare lowers g to an ML Program, writes it as an .mlpackage into the cache (keyed by its
// content and this build), compiles and loads it. A package already in the cache is not written
// again, and on darwin its compiled .mlmodelc is reused.
func (c *cmlContext) Prepare(ctx context.Context, g *core.Graph, opts ...core.PrepareOption) (core.Executable, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("coreml: prepare: %w", err)
	}
	if err := c.dev.b.check(); err != nil {
		return nil, err
	}
	if err := g.Err(); err != nil {
		return nil, fmt.Errorf("coreml: prepare: %w", err)
	}
	l, err := lower(g)
	if err != nil {
		return nil, err
	}
	key := l.key()[:32] + "-" + fmt.Sprintf("%x", buildHash(c.dev.b.Info().BuildID))
	pkg := filepath.Join(c.cacheDir, key+".mlpackage")
	if _, err := os.Stat(filepath.Join(pkg, manifestName)); err != nil {
		if err := writePackageAtomic(pkg, l); err != nil {
			return nil, err
		}
	}
	m, err := c.dev.b.eng.load(ctx, pkg, c.cacheDir, key, c.units)
	if err != nil {
		return nil, fmt.Errorf("coreml: load %s: %w", pkg, err)
	}
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
	feats := append(append([]feature(nil), l.inputs...), l.outputs...)
	return &executable{ctx: c, g: g, l: l, m: m, pkg: pkg, feats: feats, verdicts: c.verdicts(g)}, nil
}

func buildHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// writePackageAtomic writes into a temporary sibling and renames it, so that a concurrent or
// interrupted prepare never leaves a half-written package under the cache key.
func writePackageAtomic(dir string, l *lowered) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("coreml: cache: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-*.mlpackage")
	if err != nil {
		return fmt.Errorf("coreml: cache: %w", err)
	}
	if err := writePackage(tmp, l); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(filepath.Join(dir, manifestName)); serr == nil {
			return nil // another prepare wrote the same package first
		}
		return fmt.Errorf("coreml: cache: %w", err)
	}
	return nil
}

// Close refuses while executables are open, then closes the buffer context.
func (c *cmlContext) Close() error {
	c.mu.Lock()
	live := c.live
	c.mu.Unlock()
	if live > 0 {
		return fmt.Errorf("coreml: %d executables still open: %w", live, core.ErrBadState)
	}
	return c.Context.Close()
}

type executable struct {
	ctx      *cmlContext
	g        *core.Graph
	l        *lowered
	m        model
	pkg      string
	feats    []feature
	verdicts []core.NodeVerdict
	closed   atomic.Bool
}

func (e *executable) NewExecution() (core.Execution, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("coreml: executable closed: %w", core.ErrInvalidHandle)
	}
	n := len(e.g.Inputs) + len(e.g.Outputs)
	return &execution{e: e, bufs: make([]core.Buffer, n), offs: make([]int64, n)}, nil
}

func (e *executable) Serialize() ([]byte, error) {
	return nil, fmt.Errorf("coreml: the compiled model lives in the cache folder, not in a blob: %w", core.ErrUnsupported)
}

func (e *executable) Verdicts() []core.NodeVerdict {
	return append([]core.NodeVerdict(nil), e.verdicts...)
}

// Package is the .mlpackage directory an executable was prepared from (tests, xpu tooling).
func Package(ex core.Executable) (string, bool) {
	e, ok := ex.(*executable)
	if !ok {
		return "", false
	}
	return e.pkg, true
}

func (e *executable) Close() error {
	if e.closed.Swap(true) {
		return fmt.Errorf("coreml: executable closed twice: %w", core.ErrInvalidHandle)
	}
	err := e.m.close()
	e.ctx.mu.Lock()
	e.ctx.live--
	e.ctx.mu.Unlock()
	return err
}

type execution struct {
	e      *executable
	mu     sync.Mutex
	bufs   []core.Buffer
	offs   []int64
	closed bool
}

func (x *execution) tensor(io int) *core.Tensor {
	if io < len(x.e.g.Inputs) {
		return x.e.g.Inputs[io]
	}
	return x.e.g.Outputs[io-len(x.e.g.Inputs)]
}

func (x *execution) Bind(io int, buf core.Buffer, offset int64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("coreml: execution closed: %w", core.ErrInvalidHandle)
	}
	if io < 0 || io >= len(x.bufs) {
		return fmt.Errorf("coreml: bind slot %d of %d: %w", io, len(x.bufs), core.ErrInvalidArgument)
	}
	if buf == nil {
		return fmt.Errorf("coreml: bind slot %d: nil buffer: %w", io, core.ErrInvalidArgument)
	}
	if need := x.tensor(io).Bytes(); offset < 0 || offset > buf.Size() || buf.Size()-offset < need {
		return fmt.Errorf("coreml: bind slot %d: %d bytes at %d do not fit a buffer of %d: %w", io, need, offset, buf.Size(), core.ErrInvalidArgument)
	}
	x.bufs[io], x.offs[io] = buf, offset
	return nil
}

// Run maps every bound buffer and hands the bytes to Core ML in place: MLMultiArrays over the
// buffers' memory on darwin, the emulator's byte views here.
func (x *execution) Run(ctx context.Context) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed || x.e.closed.Load() {
		return fmt.Errorf("coreml: run: closed: %w", core.ErrInvalidHandle)
	}
	if err := x.e.ctx.dev.b.check(); err != nil {
		return err
	}
	in, out := map[string][]byte{}, map[string][]byte{}
	var unmap []core.Buffer
	defer func() {
		for _, b := range unmap {
			b.Unmap()
		}
	}()
	for io, buf := range x.bufs {
		if buf == nil {
			return fmt.Errorf("coreml: run: slot %d is not bound: %w", io, core.ErrBadState)
		}
		mem, err := buf.Map()
		if err != nil {
			return fmt.Errorf("coreml: run: map slot %d: %w", io, err)
		}
		unmap = append(unmap, buf)
		b := mem[x.offs[io] : x.offs[io]+x.tensor(io).Bytes()]
		if io < len(x.e.l.inputs) {
			in[x.e.l.inputs[io].name] = b
		} else {
			out[x.e.l.outputs[io-len(x.e.l.inputs)].name] = b
		}
	}
	// Core ML's gather does not fail on a bad index; OPS.md says the execution must
	for _, chk := range x.e.l.idChecks {
		b := in[x.e.l.inputs[chk.input].name]
		for i := 0; i+4 <= len(b); i += 4 {
			if id := int32(binary.LittleEndian.Uint32(b[i:])); id < 0 || int64(id) >= chk.rows {
				return fmt.Errorf("coreml: GET_ROWS id %d outside [0, %d): %w", id, chk.rows, core.ErrInvalidArgument)
			}
		}
	}
	if err := x.e.m.predict(ctx, x.e.feats, in, out); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("coreml: run: %w", ctx.Err())
		}
		return fmt.Errorf("coreml: prediction: %w", err)
	}
	return nil
}

// Submit runs synchronously (no CapAsync) after the waits.
func (x *execution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	for _, w := range waits {
		if w.Fence == nil {
			return fmt.Errorf("coreml: submit: nil fence: %w", core.ErrInvalidArgument)
		}
		if err := w.Fence.Wait(context.Background(), w.Value); err != nil {
			return err
		}
	}
	if err := x.Run(context.Background()); err != nil {
		return err
	}
	if signal != nil && signal.Fence != nil {
		return signal.Fence.Signal(signal.Value)
	}
	return nil
}

func (x *execution) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("coreml: execution closed twice: %w", core.ErrInvalidHandle)
	}
	x.closed = true
	return nil
}
