package sched

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// copyOnlyDevice hides a device's import capabilities, so the runtime keeps a device mirror of
// each arena block for it and copies through it (a unit that cannot import host memory).
type copyOnlyDevice struct{ core.Device }

func (d copyOnlyDevice) Info() core.DeviceInfo {
	info := d.Device.Info()
	info.Backend += "-copy"
	info.Caps &^= core.CapImportHost | core.CapImportFD
	return info
}

// The KV test model: per token a vector x [Hkv,D] and a query [Hq,D]; stage 0 writes the
// token's cache rows k = 0.5x+0.1, v = -x (elementwise: a row does not depend on which other
// rows share its chunk, so the caches of two runs compare bit for bit), stage 1 attends.
const (
	kvHq, kvHkv, kvD = 4, 2, 16
	kvCap            = 16
	kvRowBytes       = kvHkv * kvD * 4
	kvQBytes         = kvHq * kvD * 4
)

// kvRun is one sequence's cache and per-token inputs in one runtime.
type kvRun struct {
	rt              *Runtime
	k, v, x, q, out Span
	qoff, mask      Span
	writer, reader  int
	progs           map[int]*Program // by chunk length; -T: with the tree mask
}

func newKVRun(t *testing.T, devs []core.Device, specs []UnitSpec, writer, reader int) *kvRun {
	t.Helper()
	rt, err := NewRuntime(context.Background(), devs, specs)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, rt.Close()) })
	r := &kvRun{rt: rt, writer: writer, reader: reader, progs: map[int]*Program{}}
	a := rt.Arena()
	for _, s := range []struct {
		sp   *Span
		size int64
	}{{&r.k, kvCap * kvRowBytes}, {&r.v, kvCap * kvRowBytes}, {&r.x, kvCap * kvRowBytes}, {&r.q, kvCap * kvQBytes},
		{&r.out, kvCap * kvQBytes}, {&r.qoff, kvCap * 4}, {&r.mask, kvCap * kvCap}} {
		*s.sp, err = a.Alloc(s.size)
		require.NoError(t, err)
	}
	offs := make([]int32, kvCap)
	for i := range offs {
		offs[i] = int32(i)
	}
	copy(a.Bytes(r.qoff), core.EncodeI32(offs))
	return r
}

// program returns the two-stage program for chunks of T tokens (masked: with a T×T mask).
func (r *kvRun) program(t *testing.T, T int, masked bool) *Program {
	t.Helper()
	key := T
	if masked {
		key = -T
	}
	if p := r.progs[key]; p != nil {
		return p
	}
	g0 := core.NewGraph()
	x := g0.Input("x", core.F32, int64(T), kvHkv, kvD)
	// v = -x as a SCALE: NEG must be bit-exact, which an FP16 NPU graph (qnn on the HTP) refuses
	g0.Output(g0.Scale(x, 0.5, 0.1), g0.Scale(x, -1, 0))
	g1 := core.NewGraph()
	q := g1.Input("q", core.F32, int64(T), kvHq, kvD)
	kc := g1.Input("k_cache", core.F32, kvCap, kvHkv, kvD)
	vc := g1.Input("v_cache", core.F32, kvCap, kvHkv, kvD)
	o := core.AttentionOptions{Causal: true, QOffsetInput: g1.Input("q_offset", core.I32, 1)}
	io1 := []Binding{{Span: r.q, Stride: kvQBytes}, {Span: r.k}, {Span: r.v}, {Span: r.qoff, Stride: 4}}
	if masked {
		o.Mask = g1.Input("mask", core.I8, int64(T), int64(T))
		io1 = append(io1, Binding{Span: r.mask})
	}
	g1.Output(g1.Attention(q, kc, vc, o))
	io1 = append(io1, Binding{Span: r.out, Stride: kvQBytes})
	require.NoError(t, g0.Err())
	require.NoError(t, g1.Err())
	p, err := r.rt.Compile(context.Background(), ProgramSpec{Name: "kv", Phase: PhasePrefill, Stages: []StageSpec{
		{Name: "write", Graph: g0, Units: []int{r.writer, r.writer},
			IO: []Binding{{Span: r.x, Stride: kvRowBytes}, {Span: r.k, Stride: kvRowBytes}, {Span: r.v, Stride: kvRowBytes}}},
		{Name: "attend", Layer: 1, Graph: g1, Units: []int{r.reader}, IO: io1},
	}})
	require.NoError(t, err)
	r.progs[key] = p
	return p
}

// token is token id's x and q, the same in every run.
func kvToken(id int) (x, q []float32) {
	rng := rand.New(rand.NewPCG(uint64(id), 99))
	x, q = make([]float32, kvHkv*kvD), make([]float32, kvHq*kvD)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	return x, q
}

// step runs tokens ids as one chunk at cache row `row` (with mask, as a tree) and returns the
// attention output rows.
func (r *kvRun) step(t *testing.T, row int, ids []int, mask []byte) []float32 {
	t.Helper()
	a := r.rt.Arena()
	for i, id := range ids {
		x, q := kvToken(id)
		copy(a.Bytes(r.x)[(row+i)*kvRowBytes:], core.EncodeF32(x))
		copy(a.Bytes(r.q)[(row+i)*kvQBytes:], core.EncodeF32(q))
	}
	if mask != nil {
		copy(a.Bytes(r.mask), mask)
	}
	p := r.program(t, len(ids), mask != nil)
	require.NoError(t, p.Run(context.Background(), []Chunk{{Row: int64(row)}}))
	return core.DecodeF32(a.Bytes(r.out)[row*kvQBytes : (row+len(ids))*kvQBytes])
}

// cache is the first rows rows of the K and V caches.
func (r *kvRun) cache(rows int) []byte {
	a := r.rt.Arena()
	return append(append([]byte(nil), a.Bytes(r.k)[:rows*kvRowBytes]...), a.Bytes(r.v)[:rows*kvRowBytes]...)
}

func kvDevices(t *testing.T, name string, opts ...loader.Option) []core.Device {
	t.Helper()
	if name == "ref" {
		b := ref.New()
		t.Cleanup(func() { b.Close() })
		return b.Devices()[:1]
	}
	b, err := loader.Open(context.Background(), name, opts...)
	if errors.Is(err, core.ErrNotFound) {
		required.Skip(t, name, "plugin %s not built or cannot run here (run make all): %v", name, err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b.Devices()[:1]
}

// TestCompactKVMatchesCausalRun: a draft tree verified with a tree mask, its accepted path
// compacted, and one more token decoded, leave the same cache and the same outputs as
// decoding the accepted tokens as a plain causal chunk, on every backend; with the cache
// written by the backend's unit itself, and by a second unit of it that copies through a
// mirror of the arena (the cache shared between units, one of which cannot import it). The
// mirror must hold the compacted rows too. The plugins run in a child process besides (the
// isolated unit maps the arena's memfds: the host memmove must reach it).
func TestCompactKVMatchesCausalRun(t *testing.T) {
	const P = 5                         // prefix tokens
	parents := []int{-1, 0, 0, 1, 2, 2} // the draft tree
	keep := []int{0, 2, 5}              // the accepted path: 0 → 2 → 5
	prefix, tree, next := []int{1, 2, 3, 4, 5}, []int{10, 11, 12, 13, 14, 15}, 20
	accepted := []int{tree[0], tree[2], tree[5]}
	T := len(parents)
	mask := make([]byte, T*T)
	for i := range parents {
		for a := i; a >= 0; a = parents[a] {
			mask[i*T+a] = 1
		}
	}
	for _, backend := range []string{"ref", "neon", "opencl", "qnn"} {
		t.Run(backend, func(t *testing.T) {
			dev := kvDevices(t, backend)[0]
			info := dev.Info()
			treeMask := mask
			for _, mode := range []string{"own", "mirror", "isolated"} {
				t.Run(mode, func(t *testing.T) {
					dev := dev
					if mode == "isolated" {
						if backend == "ref" {
							t.Skip("ref runs in process only")
						}
						// a child process that sees the arena through its memfds
						dev = kvDevices(t, backend, loader.Isolated(), loader.WithoutEnv())[0]
					}
					devs := []core.Device{dev}
					specs := []UnitSpec{{Backend: info.Backend, Index: info.Index}}
					writer := 0
					if mode == "mirror" {
						cd := copyOnlyDevice{dev}
						devs = append(devs, cd)
						specs = append(specs, UnitSpec{Backend: cd.Info().Backend, Index: info.Index})
						writer = 1
					}
					spec := newKVRun(t, devs, specs, writer, 0)
					plain := newKVRun(t, devs, specs, writer, 0)
					for _, u := range spec.rt.Report().Units {
						t.Logf("unit %s sees the arena by %s", u.Unit, u.Import)
					}
					spec.step(t, 0, prefix, nil)
					plain.step(t, 0, prefix, nil)

					treeOut := spec.step(t, P, tree, treeMask)
					require.NoError(t, spec.rt.CompactKV(context.Background(), []Span{spec.k, spec.v}, kvRowBytes, P, keep))
					pathOut := plain.step(t, P, accepted, nil)
					rows := P + len(keep)
					require.Equal(t, plain.cache(rows), spec.cache(rows), "the compacted cache is the causal run's")
					if treeMask != nil {
						for i, k := range keep {
							assertClose(t, pathOut[i*kvHq*kvD:(i+1)*kvHq*kvD], treeOut[k*kvHq*kvD:(k+1)*kvHq*kvD],
								"tree output of path token %d", i)
						}
					}
					if mode == "mirror" {
						m := spec.rt.mem[writer]
						require.Equal(t, importCopy, m.mode)
						for _, s := range []Span{spec.k, spec.v} {
							buf := m.mirror(s.block)
							require.NotNil(t, buf, "the writer mirrors the cache's block")
							got := make([]byte, rows*kvRowBytes)
							require.NoError(t, buf.Read(s.Off, got))
							assert.Equal(t, spec.rt.Arena().Bytes(s)[:rows*kvRowBytes], got, "the mirror holds the compacted rows")
						}
						assert.Positive(t, spec.rt.Report().CopyBytes)
					}
					// the next token decodes over the compacted cache as over the causal one
					got := spec.step(t, rows, []int{next}, nil)
					want := plain.step(t, rows, []int{next}, nil)
					assert.Equal(t, want, got, "decode after compaction")
					assert.Equal(t, plain.cache(rows+1), spec.cache(rows+1))
				})
			}
		})
	}
}

func assertClose(t *testing.T, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if math.Abs(float64(want[i]-got[i])) > 1e-5*math.Max(1, math.Abs(float64(want[i]))) {
			assert.Failf(t, "values differ", msg+": element %d: want %g, got %g", append(args, i, want[i], got[i])...)
			return
		}
	}
}

func TestCompactRowsChecks(t *testing.T) {
	a := NewArena()
	defer a.Close()
	s, err := a.Alloc(8 * 32) // eight rows of 32 bytes (a span is 256-byte aligned)
	require.NoError(t, err)
	for i := range 8 {
		a.Bytes(s)[i*32] = byte(i)
	}
	for _, c := range []struct {
		name           string
		rowBytes, base int64
		keep           []int
	}{
		{"not ascending", 32, 1, []int{0, 2, 2}},
		{"descending", 32, 1, []int{3, 1}},
		{"negative", 32, 1, []int{-1, 2}},
		{"past the span", 32, 6, []int{0, 2}},
		{"base past the span", 32, 400, []int{0}},
		{"zero row", 0, 1, []int{0}},
		{"negative base", 32, -1, []int{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := append([]byte(nil), a.Bytes(s)...)
			_, err := a.CompactRows(s, c.rowBytes, c.base, c.keep)
			require.ErrorIs(t, err, ErrBadRows)
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Equal(t, before, a.Bytes(s), "nothing moved")
		})
	}
	moved, err := a.CompactRows(s, 32, 2, []int{0, 1})
	require.NoError(t, err)
	assert.False(t, moved, "an identity path moves nothing")
	moved, err = a.CompactRows(s, 32, 2, []int{1, 3, 5})
	require.NoError(t, err)
	assert.True(t, moved)
	var firsts []byte
	for i := range 8 {
		firsts = append(firsts, a.Bytes(s)[i*32])
	}
	assert.Equal(t, []byte{0, 1, 3, 5, 7, 5, 6, 7}, firsts, "rows 3, 5, 7 moved to 2, 3, 4; the rest untouched")
	_, err = a.CompactRows(Span{block: 9, Size: 256}, 32, 0, []int{1})
	require.ErrorIs(t, err, core.ErrBadState)
}

// TestCompactKVChecksEverySpanFirst: a path that does not fit one span moves no row of any
// span, and a closed runtime refuses.
func TestCompactKVChecksEverySpanFirst(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	big, err := rt.Arena().Alloc(1024)
	require.NoError(t, err)
	small, err := rt.Arena().Alloc(256)
	require.NoError(t, err)
	for i := range 32 {
		rt.Arena().Bytes(big)[i*32] = byte(i)
	}
	before := append([]byte(nil), rt.Arena().Bytes(big)...)
	err = rt.CompactKV(context.Background(), []Span{big, small}, 32, 4, []int{0, 6})
	require.ErrorIs(t, err, ErrBadRows, "row 10 is past the 8 rows of the small span")
	assert.Equal(t, before, rt.Arena().Bytes(big), "the big span was not touched")
	require.NoError(t, rt.CompactKV(context.Background(), []Span{big}, 32, 4, []int{0, 6}))
	assert.Equal(t, byte(10), rt.Arena().Bytes(big)[5*32])
	require.NoError(t, rt.Close())
	require.ErrorIs(t, rt.CompactKV(context.Background(), []Span{big}, 32, 4, []int{0, 6}), core.ErrBadState)
}
