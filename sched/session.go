package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/xpuhub/xpu/core"
)

// Session is a graph placed on devices and prepared once, ready to run many times: a front end
// over a Runtime (its Executor's) that places the graph by policy and runs it as a one-stage
// Program whose inputs and outputs are arena spans. Run may be called from several goroutines
// at once: each call gets a program of its own from a pool (the programs share their prepared
// executables through the runtime's cache).
type Session struct {
	graph   *core.Graph
	devices []core.Device // the units placement may use (plain devices or UnitDevices)
	names   []string      // their unit names, as the executor knows them
	policy  Policy
	strict  bool
	log     *slog.Logger
	exec    *Executor
	ownExec bool // the executor is private to this session: Close closes it

	assign []assignment
	parts  []*Partition // the program's partitions (Partition.Device: index in devices)
	plan   copyPlan
	// spec is the one-stage program every run compiles: node units are runtime indices.
	spec ProgramSpec

	mu     sync.RWMutex // Run holds it shared, Close exclusively
	closed bool

	poolMu sync.Mutex
	free   []*sessionRun

	devIndex map[string]int // unit name -> index in devices
	execMu   sync.Mutex
	execs    map[*sessionExecution]struct{} // NewExecution's, until closed

	runs, copiesDone, copyBytesDone atomic.Int64
}

// sessionRun is one compiled program of the session and the arena spans of its graph inputs
// then outputs.
type sessionRun struct {
	prog *Program
	io   []Span
}

// sessionConfig collects SessionOptions.
type sessionConfig struct {
	policy         Policy
	strict         bool
	contextOptions map[string]string
	logger         *slog.Logger
	cacheSize      int
	executor       *Executor
	trace          *Trace
}

// SessionOption configures NewSession (and NewExecutor).
type SessionOption func(*sessionConfig)

// WithPolicy sets the placement policy (default MaxPerformance).
func WithPolicy(p Policy) SessionOption { return func(c *sessionConfig) { c.policy = p } }

// Strict makes NewSession fail, with an error wrapping ErrUnsupported that names the node and
// the device's reason, when any node cannot run on its first-choice device, instead of falling
// back to another device or to the CPU.
func Strict() SessionOption { return func(c *sessionConfig) { c.strict = true } }

// WithContextOptions sets default backend-specific options for every unit a private executor
// (or NewExecutor) opens: a unit's own options (UnitDevice) win over them, and the unit's name
// includes them.
func WithContextOptions(options map[string]string) SessionOption {
	return func(c *sessionConfig) { c.contextOptions = maps.Clone(options) }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) SessionOption { return func(c *sessionConfig) { c.logger = l } }

// WithCacheSize sets how many unused prepared executables an Executor keeps (default
// DefaultCacheSize). It applies to NewExecutor, and to a session's private executor.
func WithCacheSize(n int) SessionOption { return func(c *sessionConfig) { c.cacheSize = max(n, 0) } }

// WithExecutor makes the session open its units and prepare its partitions through e, so it
// shares them with the executor's other sessions. The session does not close e; the units are
// e's, opened with e's default options (WithContextOptions of the session is then ignored, and
// so is WithTrace: the executor's trace, NewExecutor's WithTrace, records every session's runs).
func WithExecutor(e *Executor) SessionOption { return func(c *sessionConfig) { c.executor = e } }

// WithTrace records every Run of the session in t, as the runtime records a program's runs: on
// each unit's track a slice per partition run (its name, nodes and partition index), a slice
// per wait for another unit, and the copies to and from the arena of a unit that cannot import
// it.
func WithTrace(t *Trace) SessionOption { return func(c *sessionConfig) { c.trace = t } }

func newSessionConfig(opts []SessionOption) sessionConfig {
	c := sessionConfig{policy: MaxPerformance, cacheSize: DefaultCacheSize}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

// NewSession places g on execution units and prepares it. Each of devices is one unit: a plain
// device is the unit with no options ("these devices"); UnitDevice and UnitDevices make units
// with options, so one device may appear several times (neon{cpus=0} and neon{cpus=1}: two
// contexts, two places for nodes). The executor opens one context per unit and keeps it.
//
// Every unit that some node may go to gets a context, and Context.Analyze is asked once for
// the whole graph. Each node is then offered to the devices in the policy's order and goes to
// the first that accepts it. A node that no ranked device accepts falls back to the first
// device of kind CPU among devices (the reference backend counts as CPU), unless Strict is set:
// then any refusal is an error. The nodes are then put in a topological order that keeps a
// device's nodes together (see SplitGraph), and each run of nodes on one device becomes a
// partition, prepared once. An error that no device accepts a node, or a strict refusal, wraps
// ErrUnsupported and names the node with every device's reason.
func NewSession(ctx context.Context, g *core.Graph, devices []core.Device, opts ...SessionOption) (*Session, error) {
	cfg := newSessionConfig(opts)
	if g == nil || len(devices) == 0 {
		return nil, fmt.Errorf("session: need a graph and at least one device: %w", core.ErrInvalidArgument)
	}
	if cfg.policy == nil {
		return nil, fmt.Errorf("session: nil policy: %w", core.ErrInvalidArgument)
	}
	for i, d := range devices {
		if d == nil {
			return nil, fmt.Errorf("session: device %d is nil: %w", i, core.ErrInvalidArgument)
		}
	}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	s := &Session{graph: g, devices: slices.Clone(devices), policy: cfg.policy, strict: cfg.strict, log: cfg.logger,
		exec: cfg.executor, devIndex: map[string]int{}, execs: map[*sessionExecution]struct{}{}}
	if s.exec == nil {
		s.exec, s.ownExec = NewExecutor(opts...), true
	}
	for i, d := range s.devices {
		s.names = append(s.names, s.exec.unitName(d))
		s.devIndex[s.names[i]] = i
	}
	if err := s.build(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("session: %w", err), s.Close())
	}
	s.log.Debug("xpu: session ready", "policy", s.policy.Name(), "partitions", len(s.parts),
		"copies_per_run", s.plan.copies)
	return s, nil
}

// build places, compiles the first program (the runtime cuts the graph by unit: SplitGraph)
// and plans the report's copies.
func (s *Session) build(ctx context.Context) error {
	in := &placeInput{graph: s.graph, devices: s.devices, names: s.names, strict: s.strict}
	var err error
	if in.ranks, in.fallback, err = rankAll(s.graph, s.devices, s.policy); err != nil {
		return err
	}
	if err := s.analyze(ctx, in); err != nil {
		return err
	}
	if s.assign, err = place(in); err != nil {
		return err
	}
	deviceOf := make([]int, len(s.assign))
	fallbacks := 0
	for i, a := range s.assign {
		deviceOf[i] = a.Device
		if a.Fallback {
			fallbacks++
			s.log.Debug("xpu: node placed off its first choice", "node", a.Node.Name,
				"unit", s.names[a.Device], "reason", a.Reason)
		}
	}
	if fallbacks > 0 {
		s.log.Debug("xpu: nodes placed off their first-choice device (see Session.Report)",
			"nodes", fallbacks, "of", len(s.assign), "policy", s.policy.Name())
	}
	// The units placement gave a node join the executor's runtime, in the order of devices.
	// A node no output needs still goes to its own unit: on another it could join (and be
	// refused in) a live partition there, while on its own it forms a partition that is dropped.
	unitOf := make([]int, len(s.devices))
	for i := range unitOf {
		unitOf[i] = -1
	}
	for _, d := range deviceOf {
		unitOf[d] = 0
	}
	for d := range s.devices {
		if unitOf[d] < 0 {
			continue
		}
		if unitOf[d], err = s.exec.adopt(ctx, s.devices[d]); err != nil {
			return err
		}
	}
	units := make([]int, len(deviceOf))
	for i, d := range deviceOf {
		units[i] = unitOf[d]
	}
	s.spec = ProgramSpec{Name: "session", Stages: []StageSpec{{Name: "graph", Graph: s.graph, Units: units}}}
	r, err := s.newRun(ctx)
	if err != nil {
		return err
	}
	s.free = append(s.free, r)
	s.readPlacement(r.prog, unitOf)
	if s.ownExec {
		for d, u := range unitOf {
			if u < 0 {
				if err := s.exec.drop(s.devices[d]); err != nil {
					s.log.Warn("xpu: closing an unused unit", "unit", s.names[d], "err", err)
				}
			}
		}
	}
	s.plan = planCopies(s.graph, s.parts)
	return nil
}

// analyze opens a context on every device placement may use and asks it about the whole graph,
// all devices at once (opening an NPU context can take a while). A device that fails to open
// or to analyze refuses every node with that reason.
func (s *Session) analyze(ctx context.Context, in *placeInput) error {
	in.verdicts = make([][]core.NodeVerdict, len(s.devices))
	in.analyzeErr = make([]error, len(s.devices))
	var wg sync.WaitGroup
	for i, want := range in.wanted() {
		if want {
			wg.Go(func() { in.verdicts[i], in.analyzeErr[i] = s.analyzeOn(ctx, s.devices[i]) })
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, err := range in.analyzeErr {
		if errors.Is(err, errClosed) {
			return err
		}
		if err != nil {
			s.log.Warn("xpu: unit cannot analyze the graph", "unit", s.names[i], "err", err)
		}
	}
	return nil
}

// analyzeOn is one device's verdicts for the whole graph.
func (s *Session) analyzeOn(ctx context.Context, dev core.Device) ([]core.NodeVerdict, error) {
	eu, err := s.exec.open(ctx, dev)
	if err != nil {
		return nil, err
	}
	vs, err := eu.unit.Context().Analyze(ctx, s.graph)
	if err != nil {
		return nil, err
	}
	if len(vs) != len(s.graph.Nodes) {
		return nil, fmt.Errorf("%d verdicts for %d nodes: %w", len(vs), len(s.graph.Nodes), core.ErrInternal)
	}
	return vs, nil
}

// newRun compiles the session's program with arena spans for its graph inputs and outputs.
func (s *Session) newRun(ctx context.Context) (*sessionRun, error) {
	io := slices.Concat(s.graph.Inputs, s.graph.Outputs)
	r := &sessionRun{io: make([]Span, len(io))}
	binds := make([]Binding, len(io))
	allocs := s.exec.rt.arena.Allocs()
	for i, t := range io {
		// a zero-size tensor still gets a span: bindings need memory
		r.io[i] = allocs.Alloc(max(t.Bytes(), 1))
		binds[i] = Binding{Span: r.io[i]}
	}
	if allocs.Err != nil {
		return nil, allocs.Err
	}
	spec := s.spec
	spec.Stages = []StageSpec{spec.Stages[0]}
	spec.Stages[0].IO = binds
	prog, err := s.exec.rt.Compile(ctx, spec)
	if err != nil {
		return nil, err
	}
	r.prog = prog
	return r, nil
}

// readPlacement takes the report's partitions from the compiled program (their Device an index
// in devices; unitOf maps a device to its runtime unit) and the precision each backend used
// from its prepared executables.
func (s *Session) readPlacement(p *Program, unitOf []int) {
	for _, pp := range p.stages[0].parts {
		part := *pp.Partition
		part.Device = slices.Index(unitOf, pp.unit)
		s.parts = append(s.parts, &part)
		if pp.exe == nil {
			continue
		}
		if vs := pp.exe.Verdicts(); len(vs) == len(pp.Nodes) {
			for i, id := range pp.Nodes {
				if vs[i].Precision != core.PrecDefault {
					s.assign[id].Precision = vs[i].Precision
				}
			}
		}
	}
}

// acquire takes a pooled program or compiles one.
func (s *Session) acquire(ctx context.Context) (*sessionRun, error) {
	s.poolMu.Lock()
	if n := len(s.free); n > 0 {
		r := s.free[n-1]
		s.free = s.free[:n-1]
		s.poolMu.Unlock()
		return r, nil
	}
	s.poolMu.Unlock()
	return s.newRun(ctx)
}

func (s *Session) recycle(r *sessionRun) {
	s.poolMu.Lock()
	s.free = append(s.free, r)
	s.poolMu.Unlock()
}

// Run executes the graph: inputs in Graph.Inputs order (each exactly its tensor's size), outputs
// in Graph.Outputs order. Partitions run as soon as their inputs are ready, so partitions on
// different devices overlap where the graph allows. ctx cancels.
func (s *Session) Run(ctx context.Context, inputs [][]byte) ([][]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("session: run: %w", errClosed)
	}
	if len(inputs) != len(s.graph.Inputs) {
		return nil, fmt.Errorf("session: run: %d inputs, the graph has %d: %w", len(inputs),
			len(s.graph.Inputs), core.ErrInvalidArgument)
	}
	for i, t := range s.graph.Inputs {
		if int64(len(inputs[i])) != t.Bytes() {
			return nil, fmt.Errorf("session: run: input %d (%s): %d bytes, want %d: %w", i, t,
				len(inputs[i]), t.Bytes(), core.ErrInvalidArgument)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := s.acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("session: run: %w", err)
	}
	arena := s.exec.rt.arena
	for i := range s.graph.Inputs {
		copy(arena.Bytes(r.io[i]), inputs[i])
	}
	if err := r.prog.Run(ctx, []Chunk{{}}); err != nil {
		// a failed run's program is not reused: its executions may hold the failure's state
		if cerr := r.prog.Close(); cerr != nil {
			s.log.Warn("xpu: releasing a failed run's program", "err", cerr)
		}
		return nil, fmt.Errorf("session: run: %w", err)
	}
	out := make([][]byte, len(s.graph.Outputs))
	for j, t := range s.graph.Outputs {
		out[j] = slices.Clone(arena.Bytes(r.io[len(s.graph.Inputs)+j])[:t.Bytes()])
	}
	s.recycle(r)
	s.countRun()
	return out, nil
}

// Close releases every execution (including those of NewExecution) and program, and the
// executor when it is private. It waits for Runs in flight. Closing twice is a no-op.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	errs := []error{s.closeExecutions()}
	s.poolMu.Lock()
	for _, r := range s.free {
		errs = append(errs, r.prog.Close())
	}
	s.free = nil
	s.poolMu.Unlock()
	if s.ownExec {
		errs = append(errs, s.exec.Close())
	}
	return errors.Join(errs...)
}

// countRun adds a finished run to the totals of Report.
func (s *Session) countRun() {
	s.runs.Add(1)
	s.copiesDone.Add(int64(s.plan.copies))
	s.copyBytesDone.Add(s.plan.copyBytes)
}

// Graph is the graph the session runs.
func (s *Session) Graph() *core.Graph { return s.graph }

// Alloc allocates a buffer in the arena of the session's executor, for dev's unit (see
// Executor.Alloc). With a private executor, stop using the buffers when the session closes.
func (s *Session) Alloc(ctx context.Context, dev core.Device, size int64, kind core.BufferKind) (core.Buffer, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("session: alloc: %w", errClosed)
	}
	return s.exec.Alloc(ctx, dev, size, kind)
}

// NewExecution returns an Execution of the whole session: a program of its own, driven like a
// backend's execution. Bind takes graph inputs then outputs (Graph.Inputs, Graph.Outputs
// order), each bound to a buffer from Alloc at an offset; Run executes every partition, reading
// and writing the bound buffers in place. Rebinding between runs is cheap: the LLM runtime binds
// its attention K/V outputs at the next cache row of a KV cache buffer before every step. An
// Execution runs one submission at a time; use several for concurrency.
func (s *Session) NewExecution() (core.Execution, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, fmt.Errorf("session: new execution: %w", errClosed)
	}
	r, err := s.newRun(context.Background())
	if err != nil {
		return nil, fmt.Errorf("session: new execution: %w", err)
	}
	x := &sessionExecution{s: s, r: r, bound: make([]bool, len(r.io))}
	s.execMu.Lock()
	s.execs[x] = struct{}{}
	s.execMu.Unlock()
	return x, nil
}

// sessionExecution implements Execution over a session's program. Lock order: the session's
// mu, then the execution's.
type sessionExecution struct {
	s      *Session
	mu     sync.Mutex
	r      *sessionRun
	bound  []bool // per graph input then output
	closed bool
}

// lock takes the session's lock shared, then the execution's, for operation op; it fails once
// either is closed.
func (x *sessionExecution) lock(op string) (unlock func(), err error) {
	x.s.mu.RLock()
	x.mu.Lock()
	unlock = func() {
		x.mu.Unlock()
		x.s.mu.RUnlock()
	}
	if x.closed || x.s.closed {
		unlock()
		return nil, fmt.Errorf("session execution: %s: %w", op, errClosed)
	}
	return unlock, nil
}

// Bind binds graph input or output io to buf at offset. buf must come from Session.Alloc or
// Executor.Alloc (of the session's executor) for one of the session's units, and hold the
// tensor at offset.
func (x *sessionExecution) Bind(io int, buf core.Buffer, offset int64) error {
	unlock, err := x.lock("bind")
	if err != nil {
		return err
	}
	defer unlock()
	s := x.s
	t, err := s.graph.Binding(io)
	if err != nil {
		return fmt.Errorf("session execution: %w", err)
	}
	pb, ok := buf.(*placedBuffer)
	if !ok || pb == nil || pb.arena != s.exec.rt.arena {
		return fmt.Errorf("session execution: bind %s: the buffer must come from Session.Alloc or Executor.Alloc: %w",
			t, core.ErrInvalidArgument)
	}
	if _, ok := s.devIndex[pb.unit]; !ok {
		return fmt.Errorf("session execution: bind %s: unit %s is not one of the session's: %w", t, pb.unit,
			core.ErrInvalidArgument)
	}
	if offset < 0 || offset > pb.Size() || t.Bytes() > pb.Size()-offset {
		return fmt.Errorf("session execution: bind %s (%d bytes) at %d of a %d-byte buffer: %w", t, t.Bytes(),
			offset, pb.Size(), core.ErrInvalidArgument)
	}
	span, err := pb.span.Slice(offset, max(t.Bytes(), 1))
	if err != nil {
		return fmt.Errorf("session execution: bind %s: %w", t, err)
	}
	if err := x.r.prog.rebind(0, io, Binding{Span: span}); err != nil {
		return fmt.Errorf("session execution: bind %s: %w", t, err)
	}
	x.bound[io] = true
	return nil
}

// Run executes the session with the bound buffers; every input and output must be bound.
func (x *sessionExecution) Run(ctx context.Context) error {
	unlock, err := x.lock("run")
	if err != nil {
		return err
	}
	defer unlock()
	s := x.s
	for io, b := range x.bound {
		if !b {
			t, _ := s.graph.Binding(io)
			return fmt.Errorf("session execution: run: %s is not bound: %w", t, core.ErrBadState)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := x.r.prog.Run(ctx, []Chunk{{}}); err != nil {
		return fmt.Errorf("session execution: run: %w", err)
	}
	s.countRun()
	return nil
}

// Submit waits for every wait point, runs, then signals: it returns when the work is done.
func (x *sessionExecution) Submit(waits []core.FencePoint, signal *core.FencePoint) error {
	if signal != nil && signal.Fence == nil {
		return fmt.Errorf("session execution: submit: the signal point has no fence: %w", core.ErrInvalidArgument)
	}
	ctx := context.Background()
	for i, w := range waits {
		if w.Fence == nil {
			return fmt.Errorf("session execution: submit: wait %d has no fence: %w", i, core.ErrInvalidArgument)
		}
		if err := w.Fence.Wait(ctx, w.Value); err != nil {
			return fmt.Errorf("session execution: submit: wait %d: %w", i, err)
		}
	}
	if err := x.Run(ctx); err != nil {
		return err
	}
	if signal != nil {
		if err := signal.Fence.Signal(signal.Value); err != nil {
			return fmt.Errorf("session execution: submit: signal: %w", err)
		}
	}
	return nil
}

// Close releases the execution's program (not the bound buffers).
func (x *sessionExecution) Close() error {
	x.s.execMu.Lock()
	delete(x.s.execs, x)
	x.s.execMu.Unlock()
	return x.close()
}

func (x *sessionExecution) close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	return x.r.prog.Close()
}

// closeExecutions closes the executions the caller left open; Session.Close calls it.
func (s *Session) closeExecutions() error {
	s.execMu.Lock()
	xs := make([]*sessionExecution, 0, len(s.execs))
	for x := range s.execs {
		xs = append(xs, x)
	}
	clear(s.execs)
	s.execMu.Unlock()
	var errs []error
	for _, x := range xs {
		errs = append(errs, x.close())
	}
	return errors.Join(errs...)
}
