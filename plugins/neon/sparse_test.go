package neon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

// sparseKernelCase is one SPARSE_FFN shape aimed at a path of k_sparse.c.
type sparseKernelCase struct {
	M, D, S, pad, Kn int64
	fill             float64 // fraction of idx slots listed; the rest are -1
	bdt, xdt         core.DType
	ungated          bool
	act              core.SparseAct
	rank1            bool
}

func (c sparseKernelCase) String() string {
	return fmt.Sprintf("M%d_D%d_S%d_pad%d_K%d_%s_%s_ungated=%v_act%d_rank1=%v", c.M, c.D, c.S, c.pad, c.Kn, c.xdt, c.bdt,
		c.ungated, c.act, c.rank1)
}

func (c sparseKernelCase) seg() int64 {
	if c.ungated {
		return 2
	}
	return 3
}

// graph builds the node with bundles and idx as inputs, as the runner passes them.
func (c sparseKernelCase) graph() *core.Graph {
	g := core.NewGraph()
	xs := []int64{c.M, c.D}
	if c.rank1 {
		xs = []int64{c.D}
	}
	x := g.Input("x", c.xdt, xs...)
	b := g.Input("bundles", c.bdt, c.S, c.seg()*c.D+c.pad)
	idx := g.Input("idx", core.I32, c.Kn)
	g.Output(g.SparseFFN(x, b, idx, core.SparseFFNOptions{Act: c.act, Ungated: c.ungated}))
	return g
}

// inputs draws x, the bundles and an idx with duplicates (every 5th listed slot repeats the
// one before) and -1 slots.
func (c sparseKernelCase) inputs(t *testing.T, rng *rand.Rand) [][]byte {
	n := c.M * c.D
	if c.rank1 {
		n = c.D
	}
	x, err := core.Quantize(c.xdt, randF32(rng, n), 0)
	require.NoError(t, err)
	b, err := core.Quantize(c.bdt, randF32(rng, c.S*(c.seg()*c.D+c.pad)), 0)
	require.NoError(t, err)
	idx := make([]int32, c.Kn)
	for i := range idx {
		idx[i] = -1
		if rng.Float64() < c.fill {
			idx[i] = int32(rng.IntN(int(c.S)))
			if i%5 == 4 && idx[i-1] >= 0 {
				idx[i] = idx[i-1]
			}
		}
	}
	return [][]byte{x, b, core.EncodeI32(idx)}
}

func sparseKernelCases() []sparseKernelCase {
	var cs []sparseKernelCase
	for _, bdt := range []core.DType{core.Q4_0, core.Q8_0, core.F16, core.F32} {
		for _, act := range []core.SparseAct{core.SparseReLU, core.SparseReLU2, core.SparseSiLU} {
			for _, ungated := range []bool{false, true} {
				// decode: M = 1 and about a tenth of a large bundle table listed
				cs = append(cs, sparseKernelCase{M: 1, D: 512, S: 600, Kn: 600, fill: 0.1, bdt: bdt, xdt: core.F32,
					ungated: ungated, act: act})
			}
		}
		cs = append(cs,
			// prefill: M past NV_QROWS (4) and not a multiple of it; rows of x go live apart
			sparseKernelCase{M: 64, D: 128, S: 80, pad: 32, Kn: 60, fill: 0.7, bdt: bdt, xdt: core.F32},
			sparseKernelCase{M: 7, D: 96, S: 30, pad: 64, Kn: 40, fill: 0.5, bdt: bdt, xdt: core.F16, act: core.SparseReLU2},
			sparseKernelCase{M: 1, D: 256, S: 40, Kn: 30, fill: 0.8, bdt: bdt, xdt: core.F16, rank1: true, act: core.SparseSiLU},
			// a single listed neuron: less work than threads
			sparseKernelCase{M: 2, D: 64, S: 5, Kn: 1, fill: 1, bdt: bdt, xdt: core.F32})
	}
	return cs
}

// eachBuild runs fn in a subtest per NEON build, skipping (only that subtest) a build this CPU
// cannot run.
func eachBuild(t *testing.T, fn func(t *testing.T, dev core.Device, build string)) {
	for _, f := range pluginFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) { fn(t, openUsable(t, f).Devices()[0], filepath.Base(f)) })
	}
}

// TestSparseFFNKernel compares every path of the kernel (each bundle dtype, activation, gating,
// M, f16 x and output, 1 and 2 threads, both int8 dot paths) with core/ref.
func TestSparseFFNKernel(t *testing.T) {
	ctx := context.Background()
	opts := []map[string]string{{"threads": "2"}, {"threads": "1"}, {"threads": "2", "int8dot": "0"}}
	if raceEnabled || testing.Short() {
		// the Go side dominates under -race: one thread count (the bytes do not depend on it,
		// TestSparseFFNSameBytesAnyThreads) and both int8 paths
		opts = []map[string]string{{"threads": "2"}, {"threads": "2", "int8dot": "0"}}
	}
	eachBuild(t, func(t *testing.T, dev core.Device, _ string) {
		for _, o := range opts {
			for _, c := range sparseKernelCases() {
				name := fmt.Sprintf("threads=%s,int8dot=%s/%s", o["threads"], o["int8dot"], c)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(c.M*c.D+c.Kn), 18))
					g := c.graph()
					in := c.inputs(t, rng)
					compareSparse(ctx, t, g, dev, o, c.bdt, [][][]byte{in})
				})
			}
		}
	})
}

// compareSparse runs each input set through one session (so one prepared executable sees them
// all, in order) and checks each result against core/ref.
func compareSparse(ctx context.Context, t *testing.T, g *core.Graph, dev core.Device, opts map[string]string,
	bdt core.DType, ins [][][]byte) {
	t.Helper()
	s, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(), sched.WithContextOptions(opts))
	require.NoError(t, err)
	defer s.Close()
	// the conformance rows' element gates: f16 output rounding (2^-11 of an element), on-the-fly
	// Q8_0 x for quantized bundles
	tol := 1e-5
	if g.Outputs[0].DType == core.F16 {
		tol = 2e-3
	}
	if bdt.Quantized() {
		tol = 6e-2
	}
	for k, in := range ins {
		want, err := ref.Run(ctx, g, in)
		require.NoError(t, err)
		got, err := s.Run(ctx, in)
		require.NoError(t, err)
		dt := g.Outputs[0].DType
		gv, wv := decodeAny(dt, got[0]), decodeAny(dt, want[0])
		require.Len(t, gv, len(wv))
		worst, at, peak := maxError(gv, wv)
		require.LessOrEqual(t, worst/peak, tol, "input set %d: max error %g at element %d, peak %g", k, worst, at, peak)
		if dt == core.F32 && !bdt.Quantized() {
			continue
		}
		// the relative gate above is loose for quantized bundles; an NMSE catches a small
		// systematic error the element gate lets through
		var num, den float64
		for i := range wv {
			num += (gv[i] - wv[i]) * (gv[i] - wv[i])
			den += wv[i] * wv[i]
		}
		if den > 0 {
			require.LessOrEqual(t, num/den, 2e-3, "input set %d: nmse", k)
		}
	}
}

// TestSparseFFNBundlesRewritten: the bundles and idx change between runs of one prepared graph
// (the runner's cache is rewritten in place and idx is new every token); nothing derived from
// an earlier call may be reused.
func TestSparseFFNBundlesRewritten(t *testing.T) {
	ctx := context.Background()
	eachBuild(t, func(t *testing.T, dev core.Device, _ string) {
		for _, bdt := range []core.DType{core.Q4_0, core.Q8_0, core.F16, core.F32} {
			t.Run(bdt.String(), func(t *testing.T) {
				c := sparseKernelCase{M: 1, D: 128, S: 64, Kn: 64, fill: 0.3, bdt: bdt, xdt: core.F32}
				rng := rand.New(rand.NewPCG(1, 18))
				ins := [][][]byte{c.inputs(t, rng), c.inputs(t, rng)}
				// the same bundles with another idx, then the same idx over other bundles
				third := c.inputs(t, rng)
				ins = append(ins, [][]byte{ins[1][0], ins[1][1], third[2]}, [][]byte{ins[1][0], third[1], third[2]})
				compareSparse(ctx, t, c.graph(), dev, map[string]string{"threads": "2"}, bdt, ins)
			})
		}
	})
}

// TestSparseFFNBadIndex: an index outside [-1, S) fails the run with an invalid-argument
// error that names it, and the next valid run still works.
func TestSparseFFNBadIndex(t *testing.T) {
	ctx := context.Background()
	eachBuild(t, func(t *testing.T, dev core.Device, _ string) {
		c := sparseKernelCase{M: 2, D: 64, S: 10, Kn: 4, fill: 1, bdt: core.Q4_0, xdt: core.F32}
		s, err := sched.NewSession(ctx, c.graph(), []core.Device{dev}, sched.Strict())
		require.NoError(t, err)
		in := c.inputs(t, rand.New(rand.NewPCG(2, 18)))
		for _, bad := range []int32{-2, 10, 1 << 30} {
			_, err := s.Run(ctx, [][]byte{in[0], in[1], core.EncodeI32([]int32{0, -1, bad, 3})})
			require.ErrorIs(t, err, core.ErrInvalidArgument, "id %d", bad)
			assert.Contains(t, err.Error(), fmt.Sprint(bad))
		}
		_, err = s.Run(ctx, in)
		require.NoError(t, err)
		s.Close()
	})
}

// TestSparseFFNSupport: op_support answers by the bundles' dtype (QueryFor passes it as the
// weight dtype).
func TestSparseFFNSupport(t *testing.T) {
	eachBuild(t, func(t *testing.T, dev core.Device, _ string) {
		for _, c := range []struct {
			in, w core.DType
			want  core.Verdict
		}{
			{core.F32, core.Q4_0, core.VerdictYes}, {core.F32, core.Q8_0, core.VerdictYes},
			{core.F32, core.F16, core.VerdictYes}, {core.F32, core.F32, core.VerdictYes},
			{core.F16, core.Q4_0, core.VerdictYes}, {core.F32, core.Q4_K, core.VerdictNo},
			{core.F32, core.I8, core.VerdictNo}, {core.I32, core.F32, core.VerdictNo},
		} {
			q := core.OpQuery{Op: core.OpSparseFFN, DTypeIn: c.in, DTypeWeight: c.w, DTypeOut: c.in, Rank: 2}
			assert.Equal(t, c.want, dev.OpSupport(q), "%s x, %s bundles", c.in, c.w)
		}
		// the query the placement builds for a real node
		g := sparseKernelCase{M: 1, D: 32, S: 4, Kn: 2, bdt: core.Q4_0, xdt: core.F32}.graph()
		require.NoError(t, g.Err())
		assert.Equal(t, core.VerdictYes, dev.OpSupport(core.QueryFor(g.Nodes[0])))
	})
}

// TestSparseFFNSameBytesAnyThreads: the listed neurons are summed per chunk and the chunks in
// order, so the bytes do not depend on the thread count or on which thread took which chunk.
func TestSparseFFNSameBytesAnyThreads(t *testing.T) {
	ctx := context.Background()
	eachBuild(t, func(t *testing.T, dev core.Device, build string) {
		for _, c := range []sparseKernelCase{
			{M: 1, D: 512, S: 600, Kn: 600, fill: 0.3, bdt: core.Q4_0, xdt: core.F32},
			{M: 9, D: 128, S: 80, Kn: 80, fill: 0.8, bdt: core.F16, xdt: core.F32, act: core.SparseSiLU},
		} {
			g := c.graph()
			in := c.inputs(t, rand.New(rand.NewPCG(3, 18)))
			var first []byte
			for _, th := range []string{"1", "2", "2", "1"} {
				s, err := sched.NewSession(ctx, g, []core.Device{dev}, sched.Strict(),
					sched.WithContextOptions(map[string]string{"threads": th}))
				require.NoError(t, err)
				got, err := s.Run(ctx, in)
				s.Close()
				require.NoError(t, err)
				if first == nil {
					first = got[0]
					continue
				}
				require.Equal(t, first, got[0], "%s %s threads=%s", build, c, th)
			}
		}
	})
}
