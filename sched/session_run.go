//go:build ignore

package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
)

// bufKey names the buffer that holds a tensor on a device. A tensor gets one buffer per device
// that touches it: partitions on the same device share it without a copy.
type bufKey struct{ tensor, device int }

// copyOp moves a tensor from its producer's device to a consumer's device through host memory.
type copyOp struct {
	t        *core.Tensor
	from, to int // device indices
}

// runPlan is what every Run does, worked out once.
type runPlan struct {
	buffers   []bufKey        // in allocation order
	lives     map[bufKey]bool // the buffers, as a set: a tensor is read or written on a device
	graphIO   map[int]bool    // tensor IDs of the graph's inputs and outputs
	inputDevs [][]int         // per graph input: the devices that read it
	outputDev []int           // per graph output: the device that holds it
	copies    int             // host copies per Run
	copyBytes int64
	copiesIn  []int // per node ID: inputs copied in from another device
}

// planRun decides buffers, copies and wait lists for parts (in partition order, which is
// topological).
func planRun(g *core.Graph, parts []*sessionPart) runPlan {
	plan := runPlan{inputDevs: make([][]int, len(g.Inputs)), outputDev: make([]int, len(g.Outputs)),
		copiesIn: make([]int, len(g.Nodes)), lives: map[bufKey]bool{}, graphIO: map[int]bool{}}
	for _, t := range slices.Concat(g.Inputs, g.Outputs) {
		plan.graphIO[t.ID] = true
	}
	need := func(k bufKey) {
		if !plan.lives[k] {
			plan.lives[k] = true
			plan.buffers = append(plan.buffers, k)
		}
	}
	inputIndex := map[*core.Tensor]int{}
	for i, t := range g.Inputs {
		inputIndex[t] = i
	}
	producer := map[*core.Tensor]*sessionPart{}
	copier := map[bufKey]*sessionPart{} // who brings a tensor onto a device
	for _, p := range parts {
		wait := func(q *sessionPart) {
			if q != p && !slices.Contains(p.waits, q.Index) {
				p.waits = append(p.waits, q.Index)
			}
		}
		for _, t := range p.Inputs {
			k := bufKey{t.ID, p.Device}
			need(k)
			if t.Kind == core.KindInput {
				if i := inputIndex[t]; !slices.Contains(plan.inputDevs[i], p.Device) {
					plan.inputDevs[i] = append(plan.inputDevs[i], p.Device)
				}
				continue
			}
			q := producer[t]
			wait(q)
			if q.Device == p.Device {
				continue
			}
			if c, ok := copier[k]; ok {
				wait(c)
				continue
			}
			copier[k] = p
			p.copies = append(p.copies, copyOp{t: t, from: q.Device, to: p.Device})
			plan.copies++
			plan.copyBytes += t.Bytes()
			for _, id := range p.Nodes {
				if slices.Contains(g.Nodes[id].Inputs, t) {
					plan.copiesIn[id]++
					break
				}
			}
		}
		for _, t := range p.Outputs {
			need(bufKey{t.ID, p.Device})
			producer[t] = p
		}
		slices.Sort(p.waits)
	}
	for j, t := range g.Outputs {
		plan.outputDev[j] = producer[t].Device
	}
	return plan
}

// location is where a tensor's bytes live on one device.
type location struct {
	buf core.Buffer
	off int64
}

// runState is one set of executions and buffers: the session pools them for Run, and each
// Execution from NewExecution owns one.
type runState struct {
	owned   []core.Buffer
	own     map[bufKey]location // the session's buffers
	loc     map[bufKey]location // where each tensor is now: own, or a caller's bound buffer
	execs   []core.Execution    // per partition
	staging map[bufKey][]byte   // host memory for each planned copy, by destination
	// bound are the caller's (device, location) per graph input then output, for an
	// Execution; nil entries are unbound.
	bound []*boundIO
	// extra is host memory for copies to or from bound buffers on another device.
	extra map[int][]byte
}

type boundIO struct {
	device int
	loc    location
}

// acquire takes a pooled runState or makes one.
func (s *Session) acquire() (*runState, error) {
	s.poolMu.Lock()
	if n := len(s.free); n > 0 {
		rs := s.free[n-1]
		s.free = s.free[:n-1]
		s.poolMu.Unlock()
		return rs, nil
	}
	s.poolMu.Unlock()
	return s.newRunState(false)
}

func (s *Session) recycle(rs *runState) {
	s.poolMu.Lock()
	s.free = append(s.free, rs)
	s.poolMu.Unlock()
}

// newRunState allocates the buffers of the plan and binds one execution per partition. With
// lazyIO, the graph inputs' and outputs' buffers are left to ensure: the caller will likely bind
// its own, and an LLM's logits buffer is worth not allocating twice.
func (s *Session) newRunState(lazyIO bool) (rs *runState, err error) {
	rs = &runState{own: map[bufKey]location{}, loc: map[bufKey]location{}, staging: map[bufKey][]byte{},
		extra: map[int][]byte{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, rs.close())
		}
	}()
	for _, k := range s.plan.buffers {
		if lazyIO && s.plan.graphIO[k.tensor] {
			continue
		}
		if err := s.allocOwn(rs, k); err != nil {
			return nil, err
		}
	}
	for _, p := range s.parts {
		ex, err := p.exe.NewExecution()
		if err != nil {
			return nil, fmt.Errorf("partition %d: new execution: %w", p.Index, err)
		}
		rs.execs = append(rs.execs, ex)
		for i, t := range slices.Concat(p.Inputs, p.Outputs) {
			l, ok := rs.loc[bufKey{t.ID, p.Device}]
			if !ok {
				continue // lazy: bound by the caller or by ensure
			}
			if err := ex.Bind(i, l.buf, l.off); err != nil {
				return nil, fmt.Errorf("partition %d: bind %s: %w", p.Index, t, err)
			}
		}
		for _, c := range p.copies {
			rs.staging[bufKey{c.t.ID, c.to}] = make([]byte, c.t.Bytes())
		}
	}
	return rs, nil
}

// allocOwn gives tensor k a session buffer on its device.
func (s *Session) allocOwn(rs *runState, k bufKey) error {
	var c core.Context
	for _, p := range s.parts {
		if p.Device == k.device {
			c = p.ec.ctx
			break
		}
	}
	t := s.graph.Tensors[k.tensor]
	// a zero-size tensor still gets a buffer: bindings need a handle
	b, err := c.Alloc(max(t.Bytes(), 1), core.BufferDevice)
	if err != nil {
		return fmt.Errorf("alloc %s on %s: %w", t, s.names[k.device], err)
	}
	rs.owned = append(rs.owned, b)
	rs.own[k] = location{buf: b}
	rs.loc[k] = location{buf: b}
	return nil
}

// ensure gives a session buffer to every tensor that has no location yet (lazy graph I/O not
// bound in place), and binds it.
func (s *Session) ensure(rs *runState) error {
	for _, k := range s.plan.buffers {
		if _, ok := rs.loc[k]; ok {
			continue
		}
		l, ok := rs.own[k]
		if !ok {
			if err := s.allocOwn(rs, k); err != nil {
				return err
			}
			l = rs.own[k]
		}
		if err := s.relocate(rs, k, l); err != nil {
			return err
		}
	}
	return nil
}

// relocate points tensor k at l and rebinds the partitions on k's device that use it.
func (s *Session) relocate(rs *runState, k bufKey, l location) error {
	rs.loc[k] = l
	for _, p := range s.parts {
		if p.Device != k.device {
			continue
		}
		for i, t := range slices.Concat(p.Inputs, p.Outputs) {
			if t.ID == k.tensor {
				if err := rs.execs[p.Index].Bind(i, l.buf, l.off); err != nil {
					return fmt.Errorf("partition %d: bind %s: %w", p.Index, t, err)
				}
			}
		}
	}
	return nil
}

// close releases executions before the buffers they are bound to.
func (rs *runState) close() error {
	var errs []error
	for _, ex := range rs.execs {
		errs = append(errs, ex.Close())
	}
	rs.execs = nil
	for _, b := range rs.owned {
		errs = append(errs, b.Close())
	}
	rs.owned = nil
	return errors.Join(errs...)
}

// execute writes the inputs (host bytes, or copies from bound buffers on other devices), runs
// every partition once its waits are done, and reads the outputs (to host bytes, or copies to
// bound buffers on other devices; nil in out for a bound output). It returns the number of
// copies between devices it made.
func (s *Session) execute(ctx context.Context, rs *runState, inputs [][]byte) (out [][]byte, n copyCount, err error) {
	for i, t := range s.graph.Inputs {
		for _, d := range s.plan.inputDevs[i] {
			dst := rs.loc[bufKey{t.ID, d}]
			if b := rs.boundAt(i); b != nil {
				if b.device != d {
					if err := rs.copy(t, b.loc, dst); err != nil {
						return nil, n, fmt.Errorf("copy input %s to %s: %w", t, s.names[d], err)
					}
					n.add(1, t.Bytes())
				}
				continue
			}
			if err := dst.buf.Write(dst.off, inputs[i]); err != nil {
				return nil, n, fmt.Errorf("write input %s to %s: %w", t, s.names[d], err)
			}
		}
	}
	if len(s.parts) == 1 {
		err = s.runPart(ctx, rs, s.parts[0])
	} else {
		err = s.runParallel(ctx, rs)
	}
	if err != nil {
		return nil, n, err
	}
	n.add(s.plan.copies, s.plan.copyBytes)
	out = make([][]byte, len(s.graph.Outputs))
	for j, t := range s.graph.Outputs {
		src := rs.loc[bufKey{t.ID, s.plan.outputDev[j]}]
		if b := rs.boundAt(len(s.graph.Inputs) + j); b != nil {
			// On the producer's device the output was written in place; on a device that
			// also consumes it, the planned copy already brought it there.
			copied := s.plan.lives[bufKey{t.ID, b.device}]
			if b.device != s.plan.outputDev[j] && !copied {
				if err := rs.copy(t, src, b.loc); err != nil {
					return nil, n, fmt.Errorf("copy output %s to %s: %w", t, s.names[b.device], err)
				}
				n.add(1, t.Bytes())
			}
			continue
		}
		out[j] = make([]byte, t.Bytes())
		if err := src.buf.Read(src.off, out[j]); err != nil {
			return nil, n, fmt.Errorf("read output %s: %w", t, err)
		}
	}
	return out, n, nil
}

// copyCount counts copies between devices.
type copyCount struct {
	copies int
	bytes  int64
}

func (c *copyCount) add(n int, bytes int64) {
	c.copies += n
	c.bytes += bytes
}

// boundAt is the caller's binding of graph I/O io, or nil.
func (rs *runState) boundAt(io int) *boundIO {
	if io < len(rs.bound) {
		return rs.bound[io]
	}
	return nil
}

// copy moves t's bytes between devices through host memory.
func (rs *runState) copy(t *core.Tensor, from, to location) error {
	stage, ok := rs.extra[t.ID]
	if !ok {
		stage = make([]byte, t.Bytes())
		rs.extra[t.ID] = stage
	}
	if err := from.buf.Read(from.off, stage); err != nil {
		return err
	}
	return to.buf.Write(to.off, stage)
}

// runParallel starts one goroutine per partition; each waits for the partitions it depends
// on, so independent partitions on different devices overlap. The first error cancels the rest.
func (s *Session) runParallel(ctx context.Context, rs *runState) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make([]chan struct{}, len(s.parts))
	for i := range done {
		done[i] = make(chan struct{})
	}
	var wg sync.WaitGroup
	for _, p := range s.parts {
		wg.Go(func() {
			var waitStart time.Time
			if s.trace != nil && len(p.waits) > 0 {
				waitStart = time.Now()
			}
			for _, w := range p.waits {
				select {
				case <-done[w]:
				case <-runCtx.Done():
					return
				}
			}
			if !waitStart.IsZero() {
				s.trace.Slice(s.names[p.Device], fmt.Sprintf("wait for %v", p.waits), waitStart, time.Now(),
					map[string]any{"partition": p.Index, "waits": p.waits})
			}
			if err := s.runPart(runCtx, rs, p); err != nil {
				cancel(err)
				return
			}
			close(done[p.Index])
		})
	}
	wg.Wait()
	return context.Cause(runCtx)
}

// runPart brings the partition's inputs from other devices, then runs it. Executions on a
// device without CapConcurrent are serialized across every session of the executor.
func (s *Session) runPart(ctx context.Context, rs *runState, p *sessionPart) error {
	for _, c := range p.copies {
		var start time.Time
		if s.trace != nil {
			start = time.Now()
		}
		stage := rs.staging[bufKey{c.t.ID, c.to}]
		src, dst := rs.loc[bufKey{c.t.ID, c.from}], rs.loc[bufKey{c.t.ID, c.to}]
		if err := src.buf.Read(src.off, stage); err != nil {
			return fmt.Errorf("copy %s from %s: %w", c.t, s.names[c.from], err)
		}
		if err := dst.buf.Write(dst.off, stage); err != nil {
			return fmt.Errorf("copy %s to %s: %w", c.t, s.names[c.to], err)
		}
		if s.trace != nil {
			s.trace.Slice(s.names[c.to], "copy "+c.t.Name, start, time.Now(),
				map[string]any{"tensor": c.t.Name, "bytes": c.t.Bytes(), "from": s.names[c.from]})
		}
	}
	if !p.ec.concurrent {
		p.ec.run.Lock()
		defer p.ec.run.Unlock()
	}
	var start time.Time
	if s.trace != nil {
		start = time.Now()
	}
	if err := rs.execs[p.Index].Run(ctx); err != nil {
		return fmt.Errorf("partition %d on %s: %w", p.Index, s.names[p.Device], err)
	}
	if s.trace != nil {
		s.trace.Slice(s.names[p.Device], fmt.Sprintf("partition %d", p.Index), start, time.Now(), map[string]any{
			"partition": p.Index, "nodes": len(p.Nodes),
			"first": s.graph.Nodes[p.Nodes[0]].Name, "last": s.graph.Nodes[p.Nodes[len(p.Nodes)-1]].Name})
	}
	return nil
}
