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

// Session is a graph placed on devices and prepared once, ready to run many times. Run may be
// called from several goroutines at once: each call gets its own executions and buffers from a
// pool.
type Session struct {
	graph   *core.Graph
	devices []core.Device // the units placement may use (plain devices or UnitDevices)
	names   []string      // their unit names, as the executor knows them
	policy  Policy
	strict  bool
	log     *slog.Logger
	exec    *Executor
	ownExec bool   // the executor is private to this session: Close closes it
	trace   *Trace // nil: no tracing

	assign []assignment
	parts  []*sessionPart
	plan   runPlan

	mu     sync.RWMutex // Run holds it shared, Close exclusively
	closed bool

	poolMu sync.Mutex
	free   []*runState

	devIndex map[string]int // unit name -> index in devices
	execMu   sync.Mutex
	execs    map[*sessionExecution]struct{} // NewExecution's, until closed

	runs, copiesDone, copyBytesDone atomic.Int64
}

// sessionPart is a partition with its prepared executable.
type sessionPart struct {
	*Partition
	ec  *execContext
	exe core.Executable // a reference to the executor's cached executable: Close gives it back
	// copies are the cross-device transfers this partition makes before it runs.
	copies []copyOp
	// waits are the partitions that must finish first: producers of its inputs, and the
	// partitions that copy shared inputs onto its device.
	waits []int
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
// e's, opened with e's default options (WithContextOptions of the session is then ignored).
func WithExecutor(e *Executor) SessionOption { return func(c *sessionConfig) { c.executor = e } }

// WithTrace records every Run of the session in t: on each unit's track a slice per partition
// run (its index, nodes and first and last node), a slice per wait for the partitions it
// depends on and per copy between units (tensor, bytes, source unit).
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
		exec: cfg.executor, trace: cfg.trace, devIndex: map[string]int{}, execs: map[*sessionExecution]struct{}{}}
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

// build places, partitions, prepares and plans.
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
	parts, err := SplitGraph(s.graph, deviceOf)
	if err != nil {
		return err
	}
	used := make([]bool, len(s.devices))
	for _, p := range parts {
		if err := s.prepare(ctx, p); err != nil {
			return err
		}
		used[p.Device] = true
	}
	if s.ownExec {
		for i, d := range s.devices {
			if !used[i] {
				if err := s.exec.dropContext(d); err != nil {
					s.log.Warn("xpu: closing an unused unit", "unit", s.names[i], "err", err)
				}
			}
		}
	}
	s.plan = planRun(s.graph, s.parts)
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
	ec, err := s.exec.context(ctx, dev)
	if err != nil {
		return nil, err
	}
	vs, err := ec.ctx.Analyze(ctx, s.graph)
	if err != nil {
		return nil, err
	}
	if len(vs) != len(s.graph.Nodes) {
		return nil, fmt.Errorf("%d verdicts for %d nodes: %w", len(vs), len(s.graph.Nodes), core.ErrInternal)
	}
	return vs, nil
}

// prepare compiles one partition on its device and records the precision the backend used.
func (s *Session) prepare(ctx context.Context, p *Partition) error {
	dev := s.devices[p.Device]
	ec, err := s.exec.context(ctx, dev)
	if err != nil {
		return err
	}
	exe, err := s.exec.prepare(ctx, ec, p.Graph)
	if err != nil {
		return fmt.Errorf("partition %d on %s: prepare: %w", p.Index, s.names[p.Device], err)
	}
	s.parts = append(s.parts, &sessionPart{Partition: p, ec: ec, exe: exe})
	if vs := exe.Verdicts(); len(vs) == len(p.Nodes) {
		for i, id := range p.Nodes {
			if vs[i].Precision != core.PrecDefault {
				s.assign[id].Precision = vs[i].Precision
			}
		}
	}
	return nil
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
	rs, err := s.acquire()
	if err != nil {
		return nil, fmt.Errorf("session: run: %w", err)
	}
	out, copies, err := s.execute(ctx, rs, inputs)
	if err != nil {
		// An execution whose wait was cancelled may still be running on the device: never
		// hand its buffers to another Run.
		if cerr := rs.close(); cerr != nil {
			s.log.Warn("xpu: releasing a failed run's resources", "err", cerr)
		}
		return nil, fmt.Errorf("session: run: %w", err)
	}
	s.recycle(rs)
	s.countRun(copies)
	return out, nil
}

// Close releases every execution (including those of NewExecution), buffer and executable, and
// the contexts when the session's executor is private. It waits for Runs in flight. Closing
// twice is a no-op.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	errs := []error{s.closeExecutions()}
	s.poolMu.Lock()
	for _, rs := range s.free {
		errs = append(errs, rs.close())
	}
	s.free = nil
	s.poolMu.Unlock()
	for _, p := range s.parts {
		errs = append(errs, p.exe.Close())
	}
	s.parts = nil
	if s.ownExec {
		errs = append(errs, s.exec.Close())
	}
	return errors.Join(errs...)
}

// countRun adds a finished run to the totals of Report.
func (s *Session) countRun(n copyCount) {
	s.runs.Add(1)
	s.copiesDone.Add(int64(n.copies))
	s.copyBytesDone.Add(n.bytes)
}

// Graph is the graph the session runs.
func (s *Session) Graph() *core.Graph { return s.graph }
