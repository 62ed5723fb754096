package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

func TestDecomposeSeq(t *testing.T) {
	for _, c := range []struct {
		m       int64
		lengths []int64
		std     []int64
		rest    int64
	}{
		{300, []int64{256}, []int64{256}, 44},          // the sequence cut
		{600, []int64{512, 32}, []int64{512, 32}, 56},  // the multi-sequence cut
		{600, []int64{32, 512}, []int64{512, 32}, 56},  // order of the lengths does not matter
		{256, []int64{128, 256, 512}, []int64{256}, 0}, // exact fit: no remainder
		{20, []int64{32, 64}, nil, 20},                 // too short: all remainder
		{1000, []int64{1024, 512, 256, 128}, []int64{512, 256, 128}, 104},
	} {
		std, rest := DecomposeSeq(c.m, c.lengths)
		assert.Equal(t, c.std, std, "%d %v", c.m, c.lengths)
		assert.Equal(t, c.rest, rest, "%d %v", c.m, c.lengths)
	}
}

func TestSplitParts(t *testing.T) {
	for _, c := range []struct {
		name     string
		strategy SplitStrategy
		m, n     int64
		ratio    []float64
		lengths  []int64
		want     []SplitPart
	}{
		{"rows", SplitRows, 256, 4096, []float64{0.6, 0.4}, nil,
			[]SplitPart{{0, 0, 256, 0, 2464}, {1, 0, 256, 2464, 1632}}},
		{"rows small n unaligned", SplitRows, 1, 10, []float64{0.5, 0.5}, nil,
			[]SplitPart{{0, 0, 1, 0, 5}, {1, 0, 1, 5, 5}}},
		{"rows three", SplitRows, 1, 96, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, nil,
			[]SplitPart{{0, 0, 1, 0, 32}, {1, 0, 1, 32, 32}, {2, 0, 1, 64, 32}}},
		{"seq", SplitSeq, 300, 64, []float64{0.75, 0.25}, nil,
			[]SplitPart{{0, 0, 225, 0, 64}, {1, 225, 75, 0, 64}}},
		{"seq one row", SplitSeq, 1, 64, []float64{0.4, 0.6}, nil,
			[]SplitPart{{1, 0, 1, 0, 64}}},
		{"multiseq 300", SplitMultiSeq, 300, 64, nil, []int64{256},
			[]SplitPart{{0, 0, 256, 0, 64}, {1, 256, 44, 0, 64}}},
		{"multiseq 600", SplitMultiSeq, 600, 64, nil, []int64{512, 32},
			[]SplitPart{{0, 0, 512, 0, 64}, {0, 512, 32, 0, 64}, {1, 544, 56, 0, 64}}},
		{"hybrid 300", SplitHybrid, 300, 128, []float64{0.75, 0.25}, []int64{256},
			[]SplitPart{{0, 0, 256, 0, 96}, {1, 0, 256, 96, 32}, {1, 256, 44, 0, 128}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := SplitParts(c.strategy, c.m, c.n, c.ratio, c.lengths)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			// the pieces tile the output exactly
			cover := make([]int, c.m*c.n)
			for _, p := range got {
				for r := p.Row; r < p.Row+p.Rows; r++ {
					for col := p.Col; col < p.Col+p.Cols; col++ {
						cover[r*c.n+col]++
					}
				}
			}
			for i, v := range cover {
				require.Equal(t, 1, v, "element %d", i)
			}
		})
	}
}

func TestSplitPartsRejects(t *testing.T) {
	for _, c := range []struct {
		strategy SplitStrategy
		ratio    []float64
		lengths  []int64
		msg      string
	}{
		{"cols", []float64{0.5, 0.5}, nil, "strategy"},
		{SplitRows, []float64{0.5, 0.6}, nil, "sums to"},
		{SplitRows, []float64{1}, nil, "1 units"},
		{SplitRows, []float64{1.5, -0.5}, nil, "> 0"},
		{SplitRows, []float64{math.NaN(), 0.5}, nil, "> 0"},
		{SplitSeq, []float64{0.5, 0.5}, []int64{32}, "lengths are for"},
		{SplitMultiSeq, nil, nil, "no standard lengths"},
		{SplitMultiSeq, []float64{0.5, 0.5}, []int64{32}, "no ratio"},
		{SplitHybrid, []float64{0.5, 0.5}, []int64{32, 0}, "standard length 0"},
		{SplitHybrid, []float64{0.5, 0.5}, []int64{32, 32}, "twice"},
		{SplitHybrid, nil, []int64{32}, "0 units"},
	} {
		_, err := SplitParts(c.strategy, 64, 64, c.ratio, c.lengths)
		require.ErrorIs(t, err, core.ErrInvalidArgument, "%v", c)
		assert.Contains(t, err.Error(), c.msg)
	}
}

// twoRefUnits is a runtime of two reference units, closed when the test ends.
func twoRefUnits(t *testing.T) *Runtime {
	t.Helper()
	rb := ref.New()
	rt, err := NewRuntime(context.Background(), rb.Devices(), []UnitSpec{{Backend: "ref"},
		{Backend: "ref", Options: map[string]string{"u": "1"}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, rt.Close())
		rb.Close()
	})
	return rt
}

// splitGraph is h = x*0.5 (unit 0), y = h·Wᵀ (split), z = -y (unit 0): the split reads an
// activation slot and writes a stage output, which a partition after it also reads.
func splitGraph(t *testing.T, m, k, n int64, dt core.DType) *core.Graph {
	t.Helper()
	ws := make([]float32, n*k)
	for i := range ws {
		ws[i] = float32((i*7)%13-6) / 8
	}
	wb, err := core.Quantize(dt, ws, 0)
	require.NoError(t, err)
	g := core.NewGraph()
	x := g.Input("x", core.F32, m, k)
	w := g.Const("w", dt, core.Shape{n, k}, wb)
	h := g.Named("h").Scale(x, 0.5, 0)
	y := g.Named("mm").MatMul(h, w)
	g.Output(y, g.Named("z").Neg(y))
	require.NoError(t, g.Err())
	return g
}

// runSplit compiles g with the MATMUL (node 1) split by sp (nil: unsplit on unit 0), runs one
// chunk and returns y and z.
func runSplit(t *testing.T, rt *Runtime, g *core.Graph, sp *NodeSplit) ([]float32, []float32, *Program) {
	t.Helper()
	return runSplitOn(t, rt, g, sp, 0)
}

// runSplitOn is runSplit with g's other nodes (and an unsplit MATMUL) on unit.
func runSplitOn(t *testing.T, rt *Runtime, g *core.Graph, sp *NodeSplit, unit int) ([]float32, []float32, *Program) {
	t.Helper()
	a := rt.Arena()
	m, k := g.Inputs[0].Shape[0], g.Inputs[0].Shape[1]
	n := g.Outputs[0].Shape[1]
	x, err := a.Alloc(m * k * 4)
	require.NoError(t, err)
	y, err := a.Alloc(m * n * 4)
	require.NoError(t, err)
	z, err := a.Alloc(m * n * 4)
	require.NoError(t, err)
	xs := make([]float32, m*k)
	for i := range xs {
		xs[i] = float32((i*5)%11-5) / 4
	}
	copy(a.Bytes(x), core.EncodeF32(xs))
	st := StageSpec{Name: "s", Graph: g, Units: []int{unit, unit, unit}, IO: []Binding{{Span: x}, {Span: y}, {Span: z}}}
	if sp != nil {
		st.Splits = []*NodeSplit{nil, sp, nil}
	}
	p, err := rt.Compile(context.Background(), ProgramSpec{Name: "split", Phase: PhasePrefill, Stages: []StageSpec{st}})
	require.NoError(t, err)
	require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
	return core.DecodeF32(a.Bytes(y)[:m*n*4]), core.DecodeF32(a.Bytes(z)[:m*n*4]), p
}

// splitCases are every strategy, on shapes where each needs (or avoids) a merge.
func splitCases(units []int) []struct {
	name string
	m    int64
	sp   *NodeSplit
} {
	two := units[:2]
	type c = struct {
		name string
		m    int64
		sp   *NodeSplit
	}
	cases := []c{
		{"rows M=1 (decode, in place)", 1, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}}},
		{"rows M=37 (merged)", 37, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}}},
		{"rows M=1 stealing", 1, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}, Steal: true}},
		{"rows M=37 stealing (chunks merged)", 37, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}, Steal: true}},
		{"rows M=300 stealing, a ratio of its own", 300, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.3, 0.7}, Steal: true}},
		{"rows M=1 adaptive", 1, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}, Adapt: true}},
		{"rows M=37 adaptive (static with several rows)", 37, &NodeSplit{Strategy: SplitRows, Units: two, Ratio: []float64{0.6, 0.4}, Adapt: true}},
		{"seq M=37", 37, &NodeSplit{Strategy: SplitSeq, Units: two, Ratio: []float64{0.7, 0.3}}},
		{"multiseq 300 = 256 + 44", 300, &NodeSplit{Strategy: SplitMultiSeq, Units: two, Lengths: []int64{256}}},
		{"multiseq 600 = 512 + 32 + 56", 600, &NodeSplit{Strategy: SplitMultiSeq, Units: two, Lengths: []int64{512, 32}}},
		{"hybrid 300", 300, &NodeSplit{Strategy: SplitHybrid, Units: two, Ratio: []float64{0.5, 0.5}, Lengths: []int64{256}}},
	}
	if len(units) > 2 {
		cases = append(cases, c{"rows over three, merge on a fourth", 9,
			&NodeSplit{Strategy: SplitRows, Units: units[:3], Ratio: []float64{0.25, 0.25, 0.5}, Merge: units[len(units)-1]}})
	}
	for _, cs := range cases {
		if cs.sp.Merge == 0 {
			cs.sp.Merge = cs.sp.Units[0]
		}
	}
	return cases
}

// TestSplitMatchesUnsplit: every strategy gives what the unsplit MATMUL gives (bit for bit on
// the reference), for F32, F16, Q8_0 and Q4_0 weights, with parts on different units.
func TestSplitMatchesUnsplit(t *testing.T) {
	rb := ref.New()
	defer rb.Close()
	specs := []UnitSpec{{Backend: "ref"}, {Backend: "ref", Options: map[string]string{"u": "1"}},
		{Backend: "ref", Options: map[string]string{"u": "2"}}, {Backend: "ref", Options: map[string]string{"u": "3"}}}
	rt, err := NewRuntime(context.Background(), rb.Devices(), specs)
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	const k, n = 64, 96
	for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
		for _, c := range splitCases([]int{1, 2, 3, 0}) {
			t.Run(fmt.Sprintf("%s/%s", dt, c.name), func(t *testing.T) {
				g := splitGraph(t, c.m, k, n, dt)
				wantY, wantZ, p0 := runSplit(t, rt, g, nil)
				gotY, gotZ, p := runSplit(t, rt, g, c.sp)
				assert.Equal(t, wantY, gotY)
				assert.Equal(t, wantZ, gotZ)
				units := p.UnitNodes()
				for _, u := range c.sp.Units {
					assert.Positive(t, units[u], "unit %d runs a part", u)
				}
				require.NoError(t, p.Close())
				require.NoError(t, p0.Close())
			})
		}
	}
}

// TestSplitOnPlugins: the same on the neon and opencl plugins (parts on two pinned neon units,
// or on neon and opencl), against the reference within the float tolerance (the plugins
// quantize a to Q8_0 for quantized weights and may compute at f16).
func TestSplitOnPlugins(t *testing.T) {
	ctx := context.Background()
	rb := ref.New()
	defer rb.Close()
	devs := rb.Devices()
	var specs []UnitSpec
	for _, name := range []string{"neon", "opencl"} {
		b, err := loader.Open(ctx, name)
		if errors.Is(err, core.ErrNotFound) {
			if required.Is(name) {
				t.Fatalf("%s is required by %s, but: %v", name, required.Env, err)
			}
			t.Logf("plugin %s not built or cannot run here: skipped", name)
			continue
		}
		require.NoError(t, err)
		defer b.Close()
		devs = append(devs, b.Devices()[0])
		if name == "neon" {
			specs = append(specs, UnitSpec{Backend: "neon", Options: map[string]string{"cpus": "0", "threads": "1"}},
				UnitSpec{Backend: "neon", Options: map[string]string{"cpus": "1", "threads": "1"}})
		} else {
			specs = append(specs, UnitSpec{Backend: b.Devices()[0].Info().Backend})
		}
	}
	if len(specs) < 2 {
		t.Skip("needs the neon plugin (two units) or neon and opencl (run make)")
	}
	refRT, err := NewRuntime(ctx, rb.Devices(), []UnitSpec{{Backend: "ref"}})
	require.NoError(t, err)
	defer refRT.Close()
	rt, err := NewRuntime(ctx, devs, specs)
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	pairs := [][]int{{0, 1}}
	if len(specs) > 2 {
		pairs = append(pairs, []int{0, 2}, []int{2, 1})
	}
	const k, n = 64, 96
	for _, pair := range pairs {
		for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
			for _, c := range splitCases(pair) {
				name := fmt.Sprintf("%s+%s/%s/%s", specs[pair[0]], specs[pair[1]], dt, c.name)
				t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
					g := splitGraph(t, c.m, k, n, dt)
					wantY, _, p0 := runSplit(t, refRT, g, nil)
					gotY, gotZ, p := runSplit(t, rt, g, c.sp)
					tol := 2e-2
					for i := range wantY {
						require.InDelta(t, wantY[i], gotY[i], tol*max(1, math.Abs(float64(wantY[i]))), "y[%d]", i)
						require.Equal(t, -gotY[i], gotZ[i], "z[%d]", i)
					}
					require.NoError(t, p.Close())
					require.NoError(t, p0.Close())
				})
			}
		}
	}
	// The same weight whole on a unit first, then split with that unit taking the back rows:
	// its part is then rows inside a constant it already holds (the adapter passes an offset
	// into that buffer, neon a view of its repacked copy) and must give the same result.
	for _, pair := range pairs {
		other, holder := pair[0], pair[1]
		for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
			for _, c := range []struct {
				name string
				m    int64
				sp   *NodeSplit
			}{
				{"rows M=1", 1, &NodeSplit{Strategy: SplitRows, Units: []int{other, holder}, Ratio: []float64{0.6, 0.4}, Merge: holder}},
				{"rows M=37", 37, &NodeSplit{Strategy: SplitRows, Units: []int{other, holder}, Ratio: []float64{0.6, 0.4}, Merge: holder}},
				{"adaptive M=1", 1, &NodeSplit{Strategy: SplitRows, Units: []int{other, holder}, Ratio: []float64{0.5, 0.5}, Merge: holder, Adapt: true}},
			} {
				name := fmt.Sprintf("%s held whole, %s/%s/%s", specs[holder], specs[other], dt, c.name)
				t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
					g := splitGraph(t, c.m, 64, 160, dt)
					wantY, _, p0 := runSplit(t, refRT, g, nil)
					_, _, whole := runSplitOn(t, rt, g, nil, holder)
					gotY, gotZ, p := runSplitOn(t, rt, g, c.sp, holder)
					for i := range wantY {
						require.InDelta(t, wantY[i], gotY[i], 2e-2*max(1, math.Abs(float64(wantY[i]))), "y[%d]", i)
						require.Equal(t, -gotY[i], gotZ[i], "z[%d]", i)
					}
					for _, q := range []*Program{p, whole, p0} {
						require.NoError(t, q.Close())
					}
				})
			}
		}
	}
}

// TestSplitRejects: a split that cannot apply fails Compile with a clear error before anything
// runs.
func TestSplitRejects(t *testing.T) {
	rt := twoRefUnits(t)
	g := splitGraph(t, 4, 32, 64, core.F32)
	a := rt.Arena()
	x, err := a.Alloc(4 * 32 * 4)
	require.NoError(t, err)
	y, err := a.Alloc(4 * 64 * 4)
	require.NoError(t, err)
	rows := func(units ...int) *NodeSplit {
		return &NodeSplit{Strategy: SplitRows, Units: units, Ratio: []float64{0.5, 0.5}}
	}
	for _, c := range []struct {
		name   string
		splits []*NodeSplit
		msg    string
	}{
		{"not a MATMUL", []*NodeSplit{rows(0, 1), nil, nil}, "splits MATMUL nodes only"},
		{"unit out of range", []*NodeSplit{nil, rows(0, 2), nil}, "unit index 2"},
		{"unit twice", []*NodeSplit{nil, rows(1, 1), nil}, "listed twice"},
		{"bad ratio", []*NodeSplit{nil, {Strategy: SplitSeq, Units: []int{0, 1}, Ratio: []float64{0.5, 0.4}}, nil}, "sums to"},
		{"wrong length", []*NodeSplit{nil}, "1 splits for 3 nodes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := rt.Compile(context.Background(), ProgramSpec{Name: "bad", Stages: []StageSpec{{Name: "s", Graph: g,
				Units: []int{0, 0, 0}, Splits: c.splits, IO: []Binding{{Span: x}, {Span: y}, {Span: y}}}}})
			require.ErrorIs(t, err, core.ErrInvalidArgument)
			assert.Contains(t, err.Error(), c.msg)
		})
	}
}

// TestSplitOnIsolatedUnit: parts on an isolated plugin (the arena by fd, views by offset) give
// the unsplit result; a part or merge the plugin refuses (it has F32 MATMULs and no CONCAT)
// fails Compile naming the node, the part and the unit.
func TestSplitOnIsolatedUnit(t *testing.T) {
	devs, pb := refAndPlugin(t)
	specs := []UnitSpec{{Backend: "ref"}, {Backend: pb.Info().Name}}
	rt, err := NewRuntime(context.Background(), devs, specs)
	require.NoError(t, err)
	defer func() { require.NoError(t, rt.Close()) }()
	for _, sp := range []*NodeSplit{
		{Strategy: SplitSeq, Units: []int{1, 0}, Ratio: []float64{0.5, 0.5}},
		{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}},
		{Strategy: SplitHybrid, Units: []int{1, 0}, Ratio: []float64{0.5, 0.5}, Lengths: []int64{4}},
	} {
		g := splitGraph(t, 7, 32, 64, core.F32)
		wantY, wantZ, p0 := runSplit(t, rt, g, nil)
		gotY, gotZ, p := runSplit(t, rt, g, sp)
		assert.Equal(t, wantY, gotY, "%s", sp.Strategy)
		assert.Equal(t, wantZ, gotZ, "%s", sp.Strategy)
		require.NoError(t, p.Close())
		require.NoError(t, p0.Close())
	}
	// stealing in decode: the isolated unit's chunks bring a in and take their rows out
	g1 := splitGraph(t, 1, 32, 64, core.F32)
	wantY, wantZ, p0 := runSplit(t, rt, g1, nil)
	gotY, gotZ, p := runSplit(t, rt, g1, &NodeSplit{Strategy: SplitRows, Units: []int{1, 0}, Ratio: []float64{0.5, 0.5}, Steal: true})
	assert.Equal(t, wantY, gotY, "stealing")
	assert.Equal(t, wantZ, gotZ, "stealing")
	require.NoError(t, p.Close())
	// adaptive in decode: the isolated unit's part at the picked cut, three requests so the
	// balancer has measured both sides
	gotY, gotZ, p = runSplit(t, rt, g1, &NodeSplit{Strategy: SplitRows, Units: []int{1, 0}, Ratio: []float64{0.5, 0.5}, Adapt: true})
	for range 2 {
		require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
	}
	y1, z1 := outputsOf(p)
	assert.Equal(t, wantY, gotY, "adaptive")
	assert.Equal(t, wantZ, gotZ, "adaptive")
	assert.Equal(t, wantY, core.DecodeF32(rt.Arena().Bytes(y1)[:64*4]), "adaptive, third request")
	assert.Equal(t, wantZ, core.DecodeF32(rt.Arena().Bytes(z1)[:64*4]), "adaptive, third request")
	require.NoError(t, p.Close())
	require.NoError(t, p0.Close())
	// and with several rows: its chunks' column bands go out to the scratch the merge reads
	g7 := splitGraph(t, 7, 32, 64, core.F32)
	wantY, wantZ, p0 = runSplit(t, rt, g7, nil)
	gotY, gotZ, p = runSplit(t, rt, g7, &NodeSplit{Strategy: SplitRows, Units: []int{1, 0}, Ratio: []float64{0.5, 0.5}, Steal: true})
	assert.Equal(t, wantY, gotY, "stealing, 7 rows")
	assert.Equal(t, wantZ, gotZ, "stealing, 7 rows")
	require.NoError(t, p.Close())
	require.NoError(t, p0.Close())
	a := rt.Arena()
	x, err := a.Alloc(7 * 32 * 4)
	require.NoError(t, err)
	y, err := a.Alloc(7 * 64 * 4)
	require.NoError(t, err)
	for _, c := range []struct {
		dt   core.DType
		sp   *NodeSplit
		want string
	}{
		{core.Q8_0, &NodeSplit{Strategy: SplitSeq, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}}, "mm [rows 4:7, cols 0:64]"},
		{core.F32, &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}, Merge: 1}, "mm merge [rows 0:7]"},
	} {
		g := splitGraph(t, 7, 32, 64, c.dt)
		_, err := rt.Compile(context.Background(), ProgramSpec{Name: "bad", Stages: []StageSpec{{Name: "s", Graph: g,
			Units: []int{0, 0, 0}, Splits: []*NodeSplit{nil, c.sp, nil}, IO: []Binding{{Span: x}, {Span: y}, {Span: y}}}}})
		require.ErrorIs(t, err, ErrPlanRefused)
		assert.Contains(t, err.Error(), c.want)
		assert.Contains(t, err.Error(), specs[1].String())
	}
}

// TestSplitSiblingsShareTasks: two MATMULs reading one input, split the same way, run as one
// task per unit (plus the merges their M > 1 row splits need), with the unsplit results.
func TestSplitSiblingsShareTasks(t *testing.T) {
	rt := twoRefUnits(t)
	const k, n = 32, 64
	for _, m := range []int64{1, 5} {
		g := core.NewGraph()
		x := g.Input("x", core.F32, m, k)
		var ys []*core.Tensor
		for i := range 2 {
			ws := make([]float32, n*k)
			for j := range ws {
				ws[j] = float32((j*(3+i))%7-3) / 4
			}
			ys = append(ys, g.Named(fmt.Sprintf("mm%d", i)).MatMul(x, g.Const(fmt.Sprintf("w%d", i), core.F32, core.Shape{n, k}, core.EncodeF32(ws))))
		}
		g.Output(ys...)
		require.NoError(t, g.Err())
		a := rt.Arena()
		xs, err := a.Alloc(m * k * 4)
		require.NoError(t, err)
		for i := range m * k {
			copy(a.Bytes(xs)[4*i:], core.EncodeF32([]float32{float32(i%5) - 2}))
		}
		run := func(splits []*NodeSplit) ([][]float32, *Program) {
			y0, _ := a.Alloc(m * n * 4)
			y1, _ := a.Alloc(m * n * 4)
			p, err := rt.Compile(context.Background(), ProgramSpec{Name: "sib", Stages: []StageSpec{{Name: "s", Graph: g,
				Units: []int{0, 0}, Splits: splits, IO: []Binding{{Span: xs}, {Span: y0}, {Span: y1}}}}})
			require.NoError(t, err)
			require.NoError(t, p.Run(context.Background(), []Chunk{{}}))
			return [][]float32{core.DecodeF32(a.Bytes(y0)[:m*n*4]), core.DecodeF32(a.Bytes(y1)[:m*n*4])}, p
		}
		want, _ := run(nil)
		sp := &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}}
		got, p := run([]*NodeSplit{sp, sp})
		assert.Equal(t, want, got, "M=%d", m)
		parts := len(p.stages[0].parts)
		if m == 1 {
			assert.Equal(t, 2, parts, "one task per unit, written in place")
		} else {
			assert.Equal(t, 4, parts, "one task per unit and a merge per MATMUL")
		}
		steal := &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}, Steal: true}
		got, p = run([]*NodeSplit{steal, steal})
		assert.Equal(t, want, got, "M=%d, stealing", m)
		if m == 1 {
			require.Len(t, p.stages[0].parts, 2, "one stealing task per unit")
			a, b := p.stages[0].parts[0].steal, p.stages[0].parts[1].steal
			require.NotNil(t, a)
			require.NotNil(t, b)
			assert.Same(t, a.state, b.state, "both sides claim through one word")
			assert.Equal(t, []int{0, 1}, []int{a.side, b.side})
			assert.Len(t, a.chunks, len(stealChunks([]*core.Node{g.Nodes[0], g.Nodes[1]}, 0.5, stealFractions)), "the two MATMULs' rows as one range")
		} else {
			// several rows: each MATMUL's chunks go through a scratch slot its own merge reads
			require.Len(t, p.stages[0].parts, 6, "two stealing tasks and a merge per MATMUL")
			var tasks, merges int
			for _, pp := range p.stages[0].parts {
				if pp.steal != nil {
					tasks++
					assert.Len(t, pp.steal.chunks, len(stealChunks([]*core.Node{g.Nodes[0]}, 0.5, stealFractionsRows)), "one MATMUL's rows")
				} else {
					merges++
					assert.Contains(t, pp.name, "merge")
				}
			}
			assert.Equal(t, []int{4, 2}, []int{tasks, merges})
		}
		adapt := &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}, Adapt: true}
		got, p = run([]*NodeSplit{adapt, adapt})
		assert.Equal(t, want, got, "M=%d, adaptive", m)
		if m == 1 {
			require.Len(t, p.stages[0].parts, 2, "one adaptive task per unit")
			for side, pp := range p.stages[0].parts {
				require.NotNil(t, pp.steal)
				assert.True(t, pp.steal.adapt)
				assert.Equal(t, side, pp.steal.side)
				assert.Len(t, pp.steal.chunks, len(adaptSteps), "a part per cut point")
			}
			require.NotNil(t, p.cuts)
		} else {
			assert.Len(t, p.stages[0].parts, 4, "several rows: a static split")
			assert.Nil(t, p.cuts)
		}
	}
}
