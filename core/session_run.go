package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// bufKey names the buffer that holds a tensor on a device. A tensor gets one buffer per device
// that touches it: partitions on the same device share it without a copy.
type bufKey struct{ tensor, device int }

// copyOp moves a tensor from its producer's device to a consumer's device through host memory.
type copyOp struct {
	t        *Tensor
	from, to int // device indices
}

// runPlan is what every Run does, worked out once.
type runPlan struct {
	buffers   []bufKey // in allocation order
	inputDevs [][]int  // per graph input: the devices that read it
	outputDev []int    // per graph output: the device that holds it
	copies    int      // host copies per Run
	copyBytes int64
	copiesIn  []int // per node ID: inputs copied in from another device
}

// planRun decides buffers, copies and wait lists for parts (in partition order, which is
// topological).
func planRun(g *Graph, parts []*sessionPart) runPlan {
	plan := runPlan{inputDevs: make([][]int, len(g.Inputs)), outputDev: make([]int, len(g.Outputs)),
		copiesIn: make([]int, len(g.Nodes))}
	have := map[bufKey]bool{}
	need := func(k bufKey) {
		if !have[k] {
			have[k] = true
			plan.buffers = append(plan.buffers, k)
		}
	}
	inputIndex := map[*Tensor]int{}
	for i, t := range g.Inputs {
		inputIndex[t] = i
	}
	producer := map[*Tensor]*sessionPart{}
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
			if t.Kind == KindInput {
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

// runState is one Run's executions and buffers; the session pools them.
type runState struct {
	bufs    map[bufKey]Buffer
	execs   []Execution       // per partition
	staging map[bufKey][]byte // host memory for each copy, by destination
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
	return s.newRunState()
}

func (s *Session) recycle(rs *runState) {
	s.poolMu.Lock()
	s.free = append(s.free, rs)
	s.poolMu.Unlock()
}

// newRunState allocates every buffer of the plan and binds one execution per partition.
func (s *Session) newRunState() (rs *runState, err error) {
	rs = &runState{bufs: map[bufKey]Buffer{}, staging: map[bufKey][]byte{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, rs.close())
		}
	}()
	ctxOf := map[int]Context{}
	for _, p := range s.parts {
		ctxOf[p.Device] = p.ec.ctx
	}
	for _, k := range s.plan.buffers {
		t := s.graph.Tensors[k.tensor]
		// a zero-size tensor still gets a buffer: bindings need a handle
		b, err := ctxOf[k.device].Alloc(max(t.Bytes(), 1), BufferDevice)
		if err != nil {
			return nil, fmt.Errorf("alloc %s on %s: %w", t, s.devices[k.device].Info().ID(), err)
		}
		rs.bufs[k] = b
	}
	for _, p := range s.parts {
		ex, err := p.exe.NewExecution()
		if err != nil {
			return nil, fmt.Errorf("partition %d: new execution: %w", p.Index, err)
		}
		rs.execs = append(rs.execs, ex)
		for i, t := range slices.Concat(p.Inputs, p.Outputs) {
			if err := ex.Bind(i, rs.bufs[bufKey{t.ID, p.Device}], 0); err != nil {
				return nil, fmt.Errorf("partition %d: bind %s: %w", p.Index, t, err)
			}
		}
		for _, c := range p.copies {
			rs.staging[bufKey{c.t.ID, c.to}] = make([]byte, c.t.Bytes())
		}
	}
	return rs, nil
}

// close releases executions before the buffers they are bound to.
func (rs *runState) close() error {
	var errs []error
	for _, ex := range rs.execs {
		errs = append(errs, ex.Close())
	}
	rs.execs = nil
	for _, b := range rs.bufs {
		errs = append(errs, b.Close())
	}
	rs.bufs = nil
	return errors.Join(errs...)
}

// execute writes the inputs, runs every partition once its waits are done, and reads the
// outputs.
func (s *Session) execute(ctx context.Context, rs *runState, inputs [][]byte) ([][]byte, error) {
	for i, t := range s.graph.Inputs {
		for _, d := range s.plan.inputDevs[i] {
			if err := rs.bufs[bufKey{t.ID, d}].Write(0, inputs[i]); err != nil {
				return nil, fmt.Errorf("write input %s to %s: %w", t, s.devices[d].Info().ID(), err)
			}
		}
	}
	if len(s.parts) == 1 {
		if err := s.runPart(ctx, rs, s.parts[0]); err != nil {
			return nil, err
		}
	} else if err := s.runParallel(ctx, rs); err != nil {
		return nil, err
	}
	out := make([][]byte, len(s.graph.Outputs))
	for j, t := range s.graph.Outputs {
		out[j] = make([]byte, t.Bytes())
		if err := rs.bufs[bufKey{t.ID, s.plan.outputDev[j]}].Read(0, out[j]); err != nil {
			return nil, fmt.Errorf("read output %s: %w", t, err)
		}
	}
	return out, nil
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
			for _, w := range p.waits {
				select {
				case <-done[w]:
				case <-runCtx.Done():
					return
				}
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
		stage := rs.staging[bufKey{c.t.ID, c.to}]
		if err := rs.bufs[bufKey{c.t.ID, c.from}].Read(0, stage); err != nil {
			return fmt.Errorf("copy %s from %s: %w", c.t, s.devices[c.from].Info().ID(), err)
		}
		if err := rs.bufs[bufKey{c.t.ID, c.to}].Write(0, stage); err != nil {
			return fmt.Errorf("copy %s to %s: %w", c.t, s.devices[c.to].Info().ID(), err)
		}
	}
	if !p.ec.concurrent {
		p.ec.run.Lock()
		defer p.ec.run.Unlock()
	}
	if err := rs.execs[p.Index].Run(ctx); err != nil {
		return fmt.Errorf("partition %d on %s: %w", p.Index, s.devices[p.Device].Info().ID(), err)
	}
	return nil
}
