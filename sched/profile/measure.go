package profile

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/sched"
	"github.com/xpuhub/xpu/sched/hostsync"
)

// DefaultGrid is the row counts (chunk lengths) a measurement times: decode's 1 up to a 1024-row
// prefill chunk.
var DefaultGrid = []int{1, 4, 16, 64, 256, 1024}

// handoffRounds is how many handoffs measureHandoff times.
const handoffRounds = 200

// MeasureUnit is a unit to measure: an open sched.Unit and its plugin's build ID.
type MeasureUnit struct {
	Unit  *sched.Unit
	Build string
}

// Options configure Measure.
type Options struct {
	// Grid is the row counts to time (nil: DefaultGrid).
	Grid []int
	// MinTime is the least time spent timing one point (0: 20 ms); a point runs at least 3
	// times after a warm-up run, and its time is the median.
	MinTime time.Duration
	// MaxPoint bounds one point: a row count whose run would take longer (predicted from the
	// previous one in proportion) is not timed and Time extrapolates to it (0: 300 ms).
	MaxPoint time.Duration
	// Weights returns a projection's weight bytes ([N, K] of its dtype), e.g. layer 0's from
	// the model file; nil, or a nil result: synthetic weights of the right type.
	Weights func(MatMul) []byte
	// Progress is called with a line per finished point (may be nil).
	Progress func(string)
	// Passes is how many times every unit is swept, in alternating unit order, each figure the
	// least of its passes (0: 2 with several units, 1 with one). Units swept one after another
	// see different moments of a loaded machine; the least of passes in both orders is what
	// each unit does when it gets its core, comparable between units.
	Passes int
}

// Measure times every op class of model m on each unit over the grid of row counts, through
// the unit's context (the plugin's real kernels): the model's distinct projections, attention
// over as many key rows as query rows and over 1024, RMS norm, RoPE and an element-wise op,
// plus each unit's launch cost and weight bandwidth, and the bandwidth all units reach
// together. A unit that refuses an op class gets a Refused entry and is not asked again.
func Measure(ctx context.Context, units []MeasureUnit, m Model, o Options) (*Profile, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if len(units) == 0 {
		return nil, fmt.Errorf("profile: measure: no units: %w", core.ErrInvalidArgument)
	}
	if o.Grid == nil {
		o.Grid = DefaultGrid
	}
	o.Grid = slices.Sorted(slices.Values(o.Grid))
	if o.Grid[0] < 1 {
		return nil, fmt.Errorf("profile: measure: grid %v: row counts must be ≥ 1: %w", o.Grid, core.ErrInvalidArgument)
	}
	if o.MinTime <= 0 {
		o.MinTime = 20 * time.Millisecond
	}
	if o.MaxPoint <= 0 {
		o.MaxPoint = 300 * time.Millisecond
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	p := &Profile{Version: Version, Source: "measured", Model: m, Created: time.Now().UTC()}
	decode := make([]*timedGraph, len(units)) // each unit's largest M=1 projection, for bandwidth
	defer func() {
		for _, t := range decode {
			t.close()
		}
	}()
	passes := o.Passes
	if passes <= 0 {
		passes = min(len(units), 2)
	}
	p.Units = make([]Unit, len(units))
	for pass := range passes {
		for k := range units {
			ui := k
			if pass%2 == 1 {
				ui = len(units) - 1 - k
			}
			un, err := measureUnit(ctx, units[ui], m, o, &decode[ui])
			if err != nil {
				return nil, err
			}
			if pass == 0 {
				p.Units[ui] = un
			} else {
				p.Units[ui].keepLeast(un)
			}
		}
	}
	if len(units) > 1 {
		hs, err := measureHandoff(ctx, handoffRounds)
		if err != nil {
			return nil, err
		}
		p.DefaultSyncSeconds = hs.Seconds()
		o.Progress(fmt.Sprintf("handoff between units (hostsync.Signal, median of %d): %.1f µs", handoffRounds, hs.Seconds()*1e6))
		// what the runtime adds per cross-unit task, pair by pair
		for i := range units {
			for j := range units {
				if i == j {
					continue
				}
				launch := (p.Units[i].LaunchSeconds + p.Units[j].LaunchSeconds) / 2
				hop, err := measureRuntimeHop(ctx, units[i], units[j], launch, o.MinTime*5)
				if err != nil {
					o.Progress(fmt.Sprintf("runtime hop %s → %s: not measured (%v); the signal handoff stands in", p.Units[i].Name, p.Units[j].Name, err))
					continue
				}
				hop = max(hop, hs)
				p.Sync = append(p.Sync, Sync{From: p.Units[i].Name, To: p.Units[j].Name, Seconds: hop.Seconds()})
				o.Progress(fmt.Sprintf("runtime hop %s → %s: %.1f µs", p.Units[i].Name, p.Units[j].Name, hop.Seconds()*1e6))
			}
		}
		if err := sharedSlowdown(ctx, units, p, o); err != nil {
			return nil, err
		}
		gbs, err := combinedBandwidth(ctx, decode, o.MinTime*5)
		if err != nil {
			return nil, err
		}
		p.CombinedGBs = gbs
		o.Progress(fmt.Sprintf("all units together: %.1f GB/s of weights", gbs))
	}
	p.Notes = append(p.Notes, fmt.Sprintf("measured with grid %v, %v per point, points over %v extrapolated, the least of %d passes over the units in alternating order", o.Grid, o.MinTime, o.MaxPoint, passes),
		"default_sync_s: the median wake-up of a worker waiting on a hostsync.Signal another thread publishes; sync: per pair, what a sched.Runtime adds per cross-unit handoff in a chain of tiny ops (median of interleaved rounds against the chain on one unit, less a launch)")
	// the grid is not part of the key: a new measurement of the same units and model replaces
	// the old one, whatever its grid
	p.Key = Key(p.Units, m)
	return p, nil
}

// keepLeast keeps, of u's and another pass's figures for the same unit, the least time of each
// entry both have, the least launch and the most bandwidth.
func (u *Unit) keepLeast(o Unit) {
	u.LaunchSeconds = min(u.LaunchSeconds, o.LaunchSeconds)
	u.GBs = max(u.GBs, o.GBs)
	for i, e := range u.Entries {
		if e.Refused != "" {
			continue
		}
		for _, f := range o.Entries {
			if f.Refused == "" && f.Op == e.Op && f.DType == e.DType && f.M == e.M && f.K == e.K && f.N == e.N {
				u.Entries[i].Seconds = min(e.Seconds, f.Seconds)
				break
			}
		}
	}
}

// measureUnit profiles one unit; *decode receives its largest M=1 projection (kept open).
func measureUnit(ctx context.Context, mu MeasureUnit, m Model, o Options, decode **timedGraph) (Unit, error) {
	u := mu.Unit
	info := u.Device().Info()
	un := Unit{Name: u.Name(), Kind: kindOf(info.Kind), Device: info.Name, Build: mu.Build}
	say := func(format string, a ...any) { o.Progress(un.Name + ": " + fmt.Sprintf(format, a...)) }
	// launch: the smallest op there is
	lt, err := timeGraph(ctx, u, elementwiseGraph(1, 64), o.MinTime)
	if err != nil {
		return un, fmt.Errorf("profile: %s: launch cost: %w", un.Name, err)
	}
	un.LaunchSeconds = lt.Seconds()
	say("launch %.1f µs", lt.Seconds()*1e6)
	// sweep times one op class over the grid; build makes the graph for m rows, holding the op
	// per times (the time is divided by it)
	sweepN := func(op, dt string, k, n int, maxM int, build func(rows int) (*core.Graph, int, error)) error {
		var prev Entry
		for _, rows := range o.Grid {
			if rows > maxM {
				break
			}
			if prev.Seconds > 0 && prev.Seconds*float64(rows)/float64(prev.M) > o.MaxPoint.Seconds() {
				say("%s %s k=%d n=%d m=%d: skipped (predicted over %v), extrapolated", op, dt, k, n, rows, o.MaxPoint)
				break
			}
			g, per, err := build(rows)
			if err != nil {
				return err
			}
			d, err := timeGraph(ctx, u, g, o.MinTime)
			d /= time.Duration(max(per, 1))
			if refused(err) {
				un.Entries = append(un.Entries, Entry{Op: op, DType: dt, M: rows, K: k, N: n, Refused: err.Error()})
				say("%s %s: refused: %v", op, dt, err)
				return nil
			}
			if err != nil {
				return fmt.Errorf("profile: %s: %s %s m=%d k=%d n=%d: %w", un.Name, op, dt, rows, k, n, err)
			}
			prev = Entry{Op: op, DType: dt, M: rows, K: k, N: n, Seconds: d.Seconds()}
			un.Entries = append(un.Entries, prev)
			kk := k
			if op == OpAttention && k == 0 {
				kk = rows // as many keys as queries
			}
			say("%s %s m=%d k=%d n=%d: %.3f ms", op, dt, rows, kk, n, d.Seconds()*1e3)
		}
		return nil
	}
	sweep := func(op, dt string, k, n int, maxM int, build func(rows int) (*core.Graph, error)) error {
		return sweepN(op, dt, k, n, maxM, func(rows int) (*core.Graph, int, error) {
			g, err := build(rows)
			return g, 1, err
		})
	}
	refusedOp := func(op, dt string) bool {
		return slices.ContainsFunc(un.Entries, func(e Entry) bool { return e.Op == op && e.DType == dt && e.Refused != "" })
	}
	// a decode row's MATMUL as a decode step runs it: with weights from DRAM where a step's
	// weights outgrow the cache (coldMatmulGraph), else warm
	cold := m.StepBytes() > coldBytes
	decodeGraph := func(mm MatMul, dt core.DType, w []byte) (*core.Graph, int, error) {
		if cold {
			return coldMatmulGraph(mm, dt, w)
		}
		g, err := matmulGraph(1, mm, dt, w)
		return g, 1, err
	}
	var bestBytes int64
	for _, mm := range m.DistinctMatMuls() {
		if refusedOp(OpMatMul, mm.DType) {
			continue
		}
		dt, _ := core.ParseDType(mm.DType)
		w := weightsFor(o, mm, dt)
		err := sweepN(OpMatMul, mm.DType, mm.K, mm.N, math.MaxInt, func(rows int) (*core.Graph, int, error) {
			if rows == 1 {
				return decodeGraph(mm, dt, w)
			}
			g, err := matmulGraph(rows, mm, dt, w)
			return g, 1, err
		})
		if err != nil {
			return un, err
		}
		if b := WeightBytes(mm.DType, mm.K, mm.N); b > bestBytes && !refusedOp(OpMatMul, mm.DType) {
			if g, per, err := decodeGraph(mm, dt, w); err == nil {
				if tg, err := prepareGraph(ctx, u, g); err == nil {
					(*decode).close()
					*decode, bestBytes = tg, b
					tg.bytes = b * int64(per)
				}
			}
		}
	}
	if *decode != nil {
		d, err := (*decode).time(ctx, o.MinTime)
		if err != nil {
			return un, err
		}
		un.GBs = float64((*decode).bytes) / d.Seconds() / 1e9
		say("weights at %.1f GB/s (decode projection alone)", un.GBs)
	}
	q := m.Heads * m.HeadDim
	for _, kv := range []int{0, 1024} { // 0: as many key rows as query rows
		maxM := math.MaxInt
		if kv > 0 {
			maxM = kv
		}
		err := sweepN(OpAttention, "", kv, q, maxM, func(rows int) (*core.Graph, int, error) {
			if kv > 0 && rows == 1 {
				return coldAttentionGraph(kv, 0, m)
			}
			k := kv
			if k == 0 {
				k = rows
			}
			g, err := attentionGraph(rows, k, m)
			return g, 1, err
		})
		if err != nil {
			return un, err
		}
	}
	if m.KVHeads >= 2 { // one decode row over the first half of the KV heads
		half := m.KVHeads / 2
		err := sweepN(OpAttentionHeads, "", headsKeys, half*(m.Heads/m.KVHeads)*m.HeadDim, 1, func(int) (*core.Graph, int, error) {
			return coldAttentionGraph(headsKeys, half, m)
		})
		if err != nil {
			return un, err
		}
	}
	// attention over k=rows: entries keyed by the real k
	for i, e := range un.Entries {
		if e.Op == OpAttention && e.K == 0 {
			un.Entries[i].K = e.M
		}
	}
	for _, c := range []struct {
		op    string
		n     int
		build func(rows, n int) *core.Graph
	}{
		{OpNorm, m.Dim, normGraph},
		{OpRope, (m.Heads + m.KVHeads) * m.HeadDim, func(rows, n int) *core.Graph { return ropeGraph(rows, m) }},
		{OpElementwise, m.Dim, elementwiseGraph},
		{OpElementwise, m.FFN, elementwiseGraph},
	} {
		err := sweep(c.op, "", 0, c.n, math.MaxInt, func(rows int) (*core.Graph, error) {
			g := c.build(rows, c.n)
			return g, g.Err()
		})
		if err != nil {
			return un, err
		}
	}
	return un, nil
}

func kindOf(k core.DeviceKind) string {
	switch k {
	case core.DeviceGPU:
		return "gpu"
	case core.DeviceNPU:
		return "npu"
	case core.DeviceAccel:
		return "accel"
	}
	return "cpu"
}

func refused(err error) bool {
	return err != nil && (errors.Is(err, core.ErrUnsupported) || errors.Is(err, core.ErrNotFound))
}

// weightsFor is o.Weights' bytes for mm when they have the right size, else synthetic ones.
func weightsFor(o Options, mm MatMul, dt core.DType) []byte {
	want := dt.Bytes(int64(mm.K) * int64(mm.N))
	if o.Weights != nil {
		if w := o.Weights(mm); int64(len(w)) == want {
			return w
		}
	}
	return syntheticWeights(dt, mm.K, mm.N)
}

// syntheticWeights is an [n, k] weight of dt: 16 random rows quantized once and repeated, so a
// vocabulary-sized head costs one small quantization (timing does not depend on the values).
func syntheticWeights(dt core.DType, k, n int) []byte {
	rows := min(n, 16)
	rng := rand.New(rand.NewPCG(uint64(k), uint64(n)))
	xs := make([]float32, rows*k)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	var blk []byte
	if dt == core.F32 {
		blk = core.EncodeF32(xs)
	} else if q, err := core.Quantize(dt, xs, 0); err == nil {
		blk = q
	}
	out := make([]byte, 0, dt.Bytes(int64(k)*int64(n)))
	for len(blk) > 0 && int64(len(out)) < dt.Bytes(int64(k)*int64(n)) {
		out = append(out, blk...)
	}
	return out[:dt.Bytes(int64(k)*int64(n))]
}

func matmulGraph(rows int, mm MatMul, dt core.DType, w []byte) (*core.Graph, error) {
	g := core.NewGraph()
	a := g.Input("a", core.F32, int64(rows), int64(mm.K))
	g.Output(g.MatMul(a, g.Const("w", dt, core.Shape{int64(mm.N), int64(mm.K)}, w)))
	return g, g.Err()
}

// coldMatmulGraph is one decode row's MATMUL with its weights in DRAM, as a step of a model
// larger than the cache runs it: a repeated single op keeps a projection's few MB in the last
// level cache and timed a 1B model's decode about 1.6x faster than a real step runs it. The graph holds as
// many MATMULs of the row over distinct copies of the weights as make coldBytes (2 to 32), one
// after another; the time is per MATMUL.
func coldMatmulGraph(mm MatMul, dt core.DType, w []byte) (*core.Graph, int, error) {
	g := core.NewGraph()
	per := max(int64(len(w)), 1)
	copies := int(min(max(coldBytes/per, 2), 32))
	a := g.Input("a", core.F32, 1, int64(mm.K))
	for i := range copies {
		wi := w
		if i > 0 {
			wi = slices.Clone(w) // distinct memory: a backend may not copy a constant it maps
		}
		g.Output(g.MatMul(a, g.Const(fmt.Sprintf("w%d", i), dt, core.Shape{int64(mm.N), int64(mm.K)}, wi)))
	}
	return g, copies, g.Err()
}

func attentionGraph(rows, kv int, m Model) (*core.Graph, error) {
	g := core.NewGraph()
	H, Hkv, D := int64(m.Heads), int64(m.KVHeads), int64(m.HeadDim)
	q := g.Input("q", core.F32, int64(rows), H, D)
	k := g.Input("k", core.F32, int64(kv), Hkv, D)
	v := g.Input("v", core.F32, int64(kv), Hkv, D)
	g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: int64(kv - rows)}))
	return g, g.Err()
}

// headsKeys is the key count ATTENTION_HEADS is timed at (the solver scales it to others).
const headsKeys = 1024

// coldBytes is how much K/V (or weights) a cold decode timing reads per run: more than the
// last level cache of the machines this runs on, so each op finds its operands in DRAM.
const coldBytes = 64 << 20

// coldAttentionGraph is one decode row of attention over kv keys as a decode step runs it:
// cold. A step streams the whole model's weights between one layer's attention and the next
// token's, so the KV rows come from DRAM, not from the cache a repeated single op warms (a
// warm timing underestimates a 1B model's attention in a step by about a third). The graph holds as many
// attentions over distinct K/V inputs as read coldBytes (2 to 16), one after another; the time
// is per attention. part > 0 times a heads split's part instead (op set 4): KV heads [0, part) of m's
// with their query heads.
func coldAttentionGraph(kv, part int, m Model) (*core.Graph, int, error) {
	g := core.NewGraph()
	Hkv, D := int64(m.KVHeads), int64(m.HeadDim)
	hq := int64(m.Heads)
	o := core.AttentionOptions{Causal: true, QOffset: int64(kv - 1)}
	if part > 0 {
		hq = int64(part * (m.Heads / m.KVHeads))
		o.KVHeads = int64(part)
	}
	per := int64(kv) * Hkv * D * 4 * 2
	copies := int(min(max(coldBytes/per, 2), 16)) // a small model's K/V needs no more to be cold enough
	q := g.Input("q", core.F32, 1, hq, D)
	for i := range copies {
		k := g.Input(fmt.Sprintf("k%d", i), core.F32, int64(kv), Hkv, D)
		v := g.Input(fmt.Sprintf("v%d", i), core.F32, int64(kv), Hkv, D)
		g.Output(g.Attention(q, k, v, o))
	}
	return g, copies, g.Err()
}

func normGraph(rows, n int) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, int64(rows), int64(n))
	w := g.Input("w", core.F32, int64(n))
	g.Output(g.Mul(g.RMSNorm(x, 1e-5), w))
	return g
}

func ropeGraph(rows int, m Model) *core.Graph {
	g := core.NewGraph()
	x := g.Input("x", core.F32, int64(rows), int64(m.Heads+m.KVHeads), int64(m.HeadDim))
	pos := g.Input("pos", core.I32, int64(rows))
	g.Output(g.RoPE(x, pos, core.RoPEOptions{}))
	return g
}

func elementwiseGraph(rows, n int) *core.Graph {
	g := core.NewGraph()
	a := g.Input("a", core.F32, int64(rows), int64(n))
	b := g.Input("b", core.F32, int64(rows), int64(n))
	g.Output(g.Add(a, b))
	return g
}

// timedGraph is a graph prepared on a unit with every binding allocated and filled.
type timedGraph struct {
	exe   core.Executable
	ex    core.Execution
	bufs  []core.Buffer
	bytes int64 // weight bytes, for bandwidth
}

func prepareGraph(ctx context.Context, u *sched.Unit, g *core.Graph) (_ *timedGraph, err error) {
	c := u.Context()
	t := &timedGraph{}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if t.exe, err = c.Prepare(ctx, g); err != nil {
		return nil, err
	}
	if t.ex, err = t.exe.NewExecution(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for io := range len(g.Inputs) + len(g.Outputs) {
		tt, err := g.Binding(io)
		if err != nil {
			return nil, err
		}
		b, err := c.Alloc(max(tt.Bytes(), 4), core.BufferDevice)
		if err != nil {
			return nil, err
		}
		t.bufs = append(t.bufs, b)
		if io < len(g.Inputs) {
			data := make([]byte, tt.Bytes())
			switch tt.DType {
			case core.F32:
				xs := make([]float32, tt.Shape.NumElements())
				for i := range xs {
					xs[i] = rng.Float32()*2 - 1
				}
				data = core.EncodeF32(xs)
			case core.I32:
				for i := int64(0); i+4 <= int64(len(data)); i += 4 {
					data[i] = byte(i / 4) // positions 0..255 repeating: any valid position will do
				}
			}
			if err := b.Write(0, data); err != nil {
				return nil, err
			}
		}
		if err := t.ex.Bind(io, b, 0); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// time runs the graph once to warm up, then at least 3 times and for at least minTime, and
// returns the median.
func (t *timedGraph) time(ctx context.Context, minTime time.Duration) (time.Duration, error) {
	ds, err := t.samples(ctx, minTime)
	if err != nil {
		return 0, err
	}
	return ds[len(ds)/2], nil
}

// samples runs the graph once to warm up, then at least 3 times and for at least minTime, and
// returns the run times, sorted.
func (t *timedGraph) samples(ctx context.Context, minTime time.Duration) ([]time.Duration, error) {
	if err := t.ex.Run(ctx); err != nil {
		return nil, err
	}
	var ds []time.Duration
	start := time.Now()
	for len(ds) < 3 || time.Since(start) < minTime {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s := time.Now()
		if err := t.ex.Run(ctx); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(s))
		if len(ds) >= 1000 {
			break
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds, nil
}

// jitter is the mean absolute deviation of sorted samples from their median, over the median.
func jitter(ds []time.Duration) float64 {
	med := ds[len(ds)/2]
	if med <= 0 {
		return 0
	}
	var sum float64
	for _, d := range ds {
		sum += math.Abs(float64(d - med))
	}
	return sum / float64(len(ds)) / float64(med)
}

func (t *timedGraph) close() {
	if t == nil {
		return
	}
	if t.ex != nil {
		_ = t.ex.Close()
	}
	if t.exe != nil {
		_ = t.exe.Close()
	}
	for _, b := range t.bufs {
		_ = b.Close()
	}
	t.ex, t.exe, t.bufs = nil, nil, nil
}

// timeGraph prepares g on u, times it and releases it.
func timeGraph(ctx context.Context, u *sched.Unit, g *core.Graph, minTime time.Duration) (time.Duration, error) {
	if err := g.Err(); err != nil {
		return 0, err
	}
	t, err := prepareGraph(ctx, u, g)
	if err != nil {
		return 0, err
	}
	defer t.close()
	return t.time(ctx, minTime)
}

// measureHandoff is the median time from one locked thread publishing a hostsync.Signal to
// another, already waiting on it (no prediction: a short spin, then a futex), noticing: the
// runtime's cost of handing a task's output to a task on another unit, under this machine's
// load.
func measureHandoff(ctx context.Context, rounds int) (time.Duration, error) {
	sig, ack := hostsync.NewSignal(), hostsync.NewSignal()
	var sent atomic.Int64
	lat := make([]time.Duration, 0, rounds)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 1; i <= rounds; i++ {
			if err := sig.Wait(ctx, uint64(i), 0); err != nil {
				errc <- err
				return
			}
			lat = append(lat, time.Duration(time.Now().UnixNano()-sent.Load()))
			ack.Publish(uint64(i))
		}
		errc <- nil
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var werr error
	for i := 1; i <= rounds && werr == nil; i++ {
		// let the waiter get past its spin and block, as a unit waiting for a kernel does
		for s := time.Now(); time.Since(s) < 100*time.Microsecond; {
		}
		sent.Store(time.Now().UnixNano())
		sig.Publish(uint64(i))
		werr = ack.Wait(ctx, uint64(i), 0)
	}
	if err := <-errc; err != nil {
		return 0, fmt.Errorf("profile: handoff: %w", err)
	}
	if werr != nil {
		return 0, fmt.Errorf("profile: handoff: %w", werr)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], nil
}

// maxJitter bounds a measured Jitter (a profile refuses more).
const maxJitter = 10

// sharedSlowdown sets each unit's SharedSlowdown: the median time of a prefill-sized op (the
// model's first projection at 64 rows, or an element-wise op where the unit refuses it) while
// every other unit loops on its own, over the same op alone. Units on the cores of one machine
// slow each other down; units on separate processors only through memory. It also sets each
// unit's Jitter, the spread of those shared runs (see Unit.Jitter).
func sharedSlowdown(ctx context.Context, units []MeasureUnit, p *Profile, o Options) error {
	mm := p.Model.DistinctMatMuls()[0]
	dt, _ := core.ParseDType(mm.DType)
	w := weightsFor(o, mm, dt)
	graphs := make([]*timedGraph, len(units))
	defer func() {
		for _, g := range graphs {
			g.close()
		}
	}()
	for i, mu := range units {
		g, err := matmulGraph(64, mm, dt, w)
		if err != nil {
			return err
		}
		tg, err := prepareGraph(ctx, mu.Unit, g)
		if refused(err) {
			tg, err = prepareGraph(ctx, mu.Unit, elementwiseGraph(256, p.Model.FFN))
		}
		if err != nil {
			return fmt.Errorf("profile: %s: shared slowdown: %w", mu.Unit.Name(), err)
		}
		graphs[i] = tg
	}
	for i := range units {
		alone, err := graphs[i].time(ctx, o.MinTime)
		if err != nil {
			return err
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for j, g := range graphs {
			if j == i {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if g.ex.Run(ctx) != nil {
						return
					}
				}
			}()
		}
		// at least 9 runs: the spread needs more samples than the median
		ds, err := graphs[i].samples(ctx, max(o.MinTime, 9*alone))
		close(stop)
		wg.Wait()
		if err != nil {
			return err
		}
		shared := ds[len(ds)/2]
		p.Units[i].SharedSlowdown = max(1, shared.Seconds()/alone.Seconds())
		p.Units[i].Jitter = min(jitter(ds), maxJitter)
		o.Progress(fmt.Sprintf("%s: %.2f× slower while the other units run, run-to-run spread %.0f%%", p.Units[i].Name,
			p.Units[i].SharedSlowdown, 100*p.Units[i].Jitter))
	}
	return nil
}

// combinedBandwidth runs every unit's decode projection at the same time, each on its own
// goroutine, for about window, and returns the weight bytes all of them streamed per second.
func combinedBandwidth(ctx context.Context, decode []*timedGraph, window time.Duration) (float64, error) {
	var live []*timedGraph
	for _, t := range decode {
		if t != nil {
			live = append(live, t)
		}
	}
	if len(live) < 2 {
		return 0, nil
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	var firstErr error
	start := time.Now()
	for _, t := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			for time.Since(start) < window {
				if err := t.ex.Run(ctx); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				n += t.bytes
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("profile: combined bandwidth: %w", firstErr)
	}
	return float64(total) / time.Since(start).Seconds() / 1e9, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
