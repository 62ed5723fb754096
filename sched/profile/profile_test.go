package profile

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/sched"
)

var small = Model{Name: "small", Layers: 2, Dim: 64, FFN: 128, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 100, DType: "q8_0"}

func sample() *Profile {
	return &Profile{Version: Version, Source: "measured", Model: small, DefaultSyncSeconds: 1e-5,
		Units: []Unit{
			{Name: "a", Kind: "cpu", LaunchSeconds: 1e-3, Entries: []Entry{
				{Op: OpMatMul, DType: "q8_0", M: 1, K: 64, N: 128, Seconds: 2e-3},
				{Op: OpMatMul, DType: "q8_0", M: 16, K: 64, N: 128, Seconds: 5e-3},
				{Op: OpMatMul, DType: "q8_0", M: 64, K: 64, N: 128, Seconds: 9e-3},
				{Op: OpAttention, M: 4, K: 64, N: 64, Seconds: 3e-3},
			}},
			{Name: "b", Kind: "npu", StaticM: []int{1, 32, 64}, Entries: []Entry{
				{Op: OpMatMul, DType: "q8_0", M: 32, K: 64, N: 128, Seconds: 1e-3},
				{Op: OpMatMul, DType: "q8_0", M: 64, K: 64, N: 128, Seconds: 2e-3},
				{Op: OpAttention, M: 1, K: 64, N: 64, Refused: "no dynamic shapes"},
			}},
		},
		Sync: []Sync{{From: "a", To: "b", Seconds: 2e-5}},
	}
}

func TestTime(t *testing.T) {
	p := sample()
	require.NoError(t, p.Validate())
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, tc := range []struct {
		name string
		unit int
		q    Query
		want time.Duration
	}{
		{"exact", 0, Query{Op: OpMatMul, DType: "q8_0", M: 16, K: 64, N: 128}, ms(5)},
		{"interpolated", 0, Query{Op: OpMatMul, DType: "q8_0", M: 40, K: 64, N: 128}, ms(7)},
		{"below the grid", 0, Query{Op: OpMatMul, DType: "Q8_0", M: 1, K: 64, N: 128}, ms(2)},
		{"extrapolated in proportion above the launch", 0, Query{Op: OpMatMul, DType: "q8_0", M: 128, K: 64, N: 128}, ms(1 + 8*2)},
		{"row-cut part scaled by N", 0, Query{Op: OpMatMul, DType: "q8_0", M: 64, K: 64, N: 64}, ms(1 + 8*0.5)},
		{"static: padded up", 1, Query{Op: OpMatMul, DType: "q8_0", M: 40, K: 64, N: 128}, ms(2)},
		{"static: runs of the largest", 1, Query{Op: OpMatMul, DType: "q8_0", M: 100, K: 64, N: 128}, ms(4)},
		{"attention over more keys", 0, Query{Op: OpAttention, M: 4, K: 128, N: 64}, ms(1 + 2*2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Time(tc.unit, tc.q)
			require.NoError(t, err)
			assert.InDelta(t, tc.want.Seconds(), got.Seconds(), 1e-9)
		})
	}
	_, err := p.Time(1, Query{Op: OpAttention, M: 1, K: 64, N: 64})
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorIs(t, err, core.ErrUnsupported)
	assert.ErrorContains(t, err, "no dynamic shapes")
	_, err = p.Time(0, Query{Op: OpRope, M: 1, N: 64})
	require.ErrorIs(t, err, ErrNoEntry)
	_, err = p.Time(2, Query{Op: OpRope, M: 1, N: 64})
	require.ErrorIs(t, err, ErrBadProfile)
	_, err = p.Time(0, Query{Op: OpRope, M: 0, N: 64})
	require.ErrorIs(t, err, ErrBadProfile)
	assert.Equal(t, 20*time.Microsecond, p.SyncCost(0, 1))
	assert.Equal(t, 10*time.Microsecond, p.SyncCost(1, 0))
	assert.Zero(t, p.SyncCost(1, 1))
	// the index follows added entries
	p.Units[0].Entries = append(p.Units[0].Entries, Entry{Op: OpRope, M: 1, N: 64, Seconds: 1})
	got, err := p.Time(0, Query{Op: OpRope, M: 1, N: 64})
	require.NoError(t, err)
	assert.Equal(t, time.Second, got)
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(p *Profile)
	}{
		{"version", func(p *Profile) { p.Version = 2 }},
		{"source", func(p *Profile) { p.Source = "guessed" }},
		{"no units", func(p *Profile) { p.Units = nil }},
		{"repeated unit", func(p *Profile) { p.Units[1].Name = "a" }},
		{"kind", func(p *Profile) { p.Units[0].Kind = "dsp" }},
		{"op", func(p *Profile) { p.Units[0].Entries[0].Op = "CONV" }},
		{"negative time", func(p *Profile) { p.Units[0].Entries[0].Seconds = -1 }},
		{"zero time", func(p *Profile) { p.Units[0].Entries[0].Seconds = 0 }},
		{"dtype", func(p *Profile) { p.Units[0].Entries[0].DType = "q9" }},
		{"static sizes", func(p *Profile) { p.Units[1].StaticM = []int{64, 32} }},
		{"sync unit", func(p *Profile) { p.Sync[0].To = "c" }},
		{"model", func(p *Profile) { p.Model.Heads = 3 }},
		{"jitter", func(p *Profile) { p.Units[0].Jitter = 11 }},
		{"jitter NaN", func(p *Profile) { p.Units[0].Jitter = math.NaN() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sample()
			tc.break_(p)
			require.ErrorIs(t, p.Validate(), ErrBadProfile)
		})
	}
}

func TestParseSaveLoad(t *testing.T) {
	p := sample()
	p.Key = Key(p.Units, p.Model, "grid")
	b, err := p.Marshal()
	require.NoError(t, err)
	back, err := Parse(b)
	require.NoError(t, err)
	assert.Equal(t, p.Units, back.Units)
	_, err = Parse([]byte(`{"version":1,"bogus":1}`))
	require.ErrorIs(t, err, ErrBadProfile)
	_, err = Parse(append(b, []byte(`{}`)...))
	require.ErrorIs(t, err, ErrBadProfile)

	dir := t.TempDir()
	path, err := Save(dir, p)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, p.Key+".json"), path)
	got, gotPath, err := Load(dir, p.Key)
	require.NoError(t, err)
	assert.Equal(t, path, gotPath)
	assert.Equal(t, p.Model, got.Model)
	_, _, err = Load(dir, "nothing")
	require.ErrorIs(t, err, ErrNoProfile)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.json"), []byte("{"), 0o644))
	_, _, err = Load(dir, "broken")
	require.ErrorContains(t, err, "broken.json")
	p.Key = "../x"
	_, err = Save(dir, p)
	require.ErrorIs(t, err, ErrBadProfile)

	// the key follows the plugin build, the device, the model and the options
	k := Key(sample().Units, small, "g")
	u := sample().Units
	u[0].Build = "other"
	assert.NotEqual(t, k, Key(u, small, "g"))
	assert.NotEqual(t, k, Key(sample().Units, small, "h"))
	m2 := small
	m2.Layers = 3
	assert.NotEqual(t, k, Key(sample().Units, m2, "g"))
}

func TestCacheDir(t *testing.T) {
	t.Setenv("XPU_CACHE_DIR", "/x")
	d, err := CacheDir()
	require.NoError(t, err)
	assert.Equal(t, "/x/profiles", d)
	t.Setenv("XPU_CACHE_DIR", "")
	t.Setenv("XDG_CACHE_HOME", "/y")
	d, err = CacheDir()
	require.NoError(t, err)
	assert.Equal(t, "/y/xpu/profiles", d)
}

func TestModel(t *testing.T) {
	require.NoError(t, small.Validate())
	mms := small.MatMuls()
	require.Len(t, mms, 8)
	assert.Equal(t, MatMul{"ffn_down", 128, 64, "q8_0"}, mms[6])
	assert.Equal(t, MatMul{"logits", 64, 100, "q8_0"}, mms[7])
	// q and o (heads·head_dim = dim); k, v; gate, up; down; logits
	assert.Len(t, small.DistinctMatMuls(), 5)
	assert.Equal(t, int64(2*(64*64*2+64*32*2+3*64*128)+64*100), small.Params())
	// 2 layers of q, k, v, o, gate, up, down, then the head: 34 bytes per 32 weights
	assert.Equal(t, (2*(64*64*2+64*32*2+3*64*128)+64*100)/32*34, int(small.StepBytes()))
	bad := small
	bad.DType = "q9"
	require.Error(t, bad.Validate())
	assert.Equal(t, int64(34*2), WeightBytes("q8_0", 64, 1))
}

// A cold decode MATMUL runs the row over distinct copies of the weights, enough to read
// coldBytes (2 to 32 of them), one output each.
func TestColdMatmulGraph(t *testing.T) {
	for _, tc := range []struct {
		name   string
		k, n   int
		copies int
	}{
		{"4 MiB of F32: 16 copies", 1024, 1024, 16},
		{"64 KiB: capped at 32", 128, 128, 32},
		{"64 MiB: at least 2", 4096, 4096, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mm := MatMul{Name: "attn_q", K: tc.k, N: tc.n, DType: "f32"}
			w := make([]byte, WeightBytes("f32", tc.k, tc.n))
			g, per, err := coldMatmulGraph(mm, core.F32, w)
			require.NoError(t, err)
			assert.Equal(t, tc.copies, per)
			assert.Len(t, g.Outputs, per)
			seen := map[*byte]bool{}
			for _, tt := range g.Tensors {
				if tt.Kind == core.KindConst {
					assert.False(t, seen[&tt.Data[0]], "a copy shares another's memory")
					seen[&tt.Data[0]] = true
				}
			}
			assert.Len(t, seen, per)
		})
	}
}

// Measure times the reference backend through a sched unit: every op class on every grid row
// count, positive times, a launch cost and a bandwidth.
func TestMeasureReference(t *testing.T) {
	dev := ref.New().Devices()[0]
	info := dev.Info()
	u, err := sched.OpenUnit(context.Background(), dev, sched.UnitSpec{Backend: info.Backend, Index: info.Index})
	require.NoError(t, err)
	defer u.Close()
	var lines []string
	p, err := Measure(context.Background(), []MeasureUnit{{Unit: u, Build: "test"}}, small,
		Options{Grid: []int{1, 8}, MinTime: time.Millisecond, MaxPoint: time.Minute, Progress: func(s string) { lines = append(lines, s) }})
	require.NoError(t, err)
	require.NoError(t, p.Validate())
	require.Len(t, p.Units, 1)
	un := p.Units[0]
	assert.Equal(t, u.Name(), un.Name)
	assert.Positive(t, un.LaunchSeconds)
	assert.Positive(t, un.GBs)
	ops := map[string]int{}
	for _, e := range un.Entries {
		assert.Empty(t, e.Refused)
		assert.Positive(t, e.Seconds)
		ops[e.Op]++
	}
	assert.Equal(t, map[string]int{OpMatMul: 5 * 2, OpAttention: 2 * 2, OpAttentionHeads: 1, OpNorm: 2, OpRope: 2, OpElementwise: 4}, ops)
	assert.NotEmpty(t, p.Key)
	assert.NotEmpty(t, lines)
	for _, q := range []Query{{Op: OpMatMul, DType: "q8_0", M: 4, K: 64, N: 64}, {Op: OpAttention, M: 8, K: 300, N: 64}} {
		d, err := p.Time(0, q)
		require.NoError(t, err)
		assert.Positive(t, d)
	}
	// two units: the handoff and the combined bandwidth are measured too
	u2, err := sched.OpenUnit(context.Background(), dev, sched.UnitSpec{Backend: info.Backend, Index: info.Index, Options: map[string]string{"threads": "1"}})
	require.NoError(t, err)
	defer u2.Close()
	p2, err := Measure(context.Background(), []MeasureUnit{{Unit: u, Build: "a"}, {Unit: u2, Build: "a"}}, small,
		Options{Grid: []int{1}, MinTime: time.Millisecond, MaxPoint: time.Minute})
	require.NoError(t, err)
	require.NoError(t, p2.Validate())
	assert.Positive(t, p2.DefaultSyncSeconds)
	assert.Less(t, p2.DefaultSyncSeconds, 1.0)
	assert.Positive(t, p2.CombinedGBs)
	for _, un := range p2.Units {
		assert.GreaterOrEqual(t, un.SharedSlowdown, 1.0)
		assert.GreaterOrEqual(t, un.Jitter, 0.0)
		assert.LessOrEqual(t, un.Jitter, float64(maxJitter))
	}
	assert.Contains(t, p2.Notes[0], "least of 2 passes")
	// the runtime's per-handoff cost, each way, never below the bare signal
	require.Len(t, p2.Sync, 2)
	for _, y := range p2.Sync {
		assert.GreaterOrEqual(t, y.Seconds, p2.DefaultSyncSeconds)
		assert.Less(t, y.Seconds, 1.0)
	}
	_, err = Measure(context.Background(), nil, small, Options{})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	_, err = Measure(context.Background(), []MeasureUnit{{Unit: u}}, small, Options{Grid: []int{0}})
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Measure(ctx, []MeasureUnit{{Unit: u}}, small, Options{Grid: []int{1}})
	require.Error(t, err)
}

func FuzzParse(f *testing.F) {
	b, _ := json.Marshal(sample())
	f.Add(b)
	f.Add([]byte(`{"version":1,"source":"measured","units":[{"name":"a","kind":"cpu","entries":[{"op":"MATMUL","m":1,"n":1,"s":1}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			return
		}
		for u := range p.Units {
			for _, e := range p.Units[u].Entries {
				_, _ = p.Time(u, Query{Op: e.Op, DType: e.DType, M: max(e.M, 1), K: e.K, N: max(e.N, 1)})
			}
		}
		assert.True(t, strings.HasPrefix(p.Source, "measured") || p.Simulated())
	})
}

// Attention timed over as many keys as queries has one point per K: a decode step over 200
// keys comes from the sweep over 1024 keys (which has one-row points), scaled, not from the
// 256-row point over 256 keys.
func TestTimePrefersGroupsCoveringM(t *testing.T) {
	p := sample()
	p.Units[0].LaunchSeconds = 0
	p.Units[0].Entries = []Entry{
		{Op: OpAttention, M: 256, K: 256, N: 64, Seconds: 1},
		{Op: OpAttention, M: 1, K: 1024, N: 64, Seconds: 0.004},
		{Op: OpAttention, M: 64, K: 1024, N: 64, Seconds: 0.1},
	}
	got, err := p.Time(0, Query{Op: OpAttention, M: 1, K: 200, N: 64})
	require.NoError(t, err)
	assert.InDelta(t, 0.004*200/1024, got.Seconds(), 1e-9)
}

func TestJitter(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		want float64
	}{
		{"steady", ms(5, 5, 5), 0},
		{"spread", ms(1, 2, 3), 1.0 / 3},
		{"one slow run", ms(10, 10, 10, 40), 30.0 / 4 / 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.want, jitter(tc.ds), 1e-9)
		})
	}
}

// keepLeast merges a second pass: the least time per entry both passes have, the least launch,
// the most bandwidth; refused entries and entries of one pass only stay as they were.
func TestKeepLeast(t *testing.T) {
	a := Unit{LaunchSeconds: 2e-5, GBs: 10, Entries: []Entry{
		{Op: OpMatMul, DType: "q4_0", M: 1, K: 64, N: 64, Seconds: 3},
		{Op: OpMatMul, DType: "q4_0", M: 4, K: 64, N: 64, Seconds: 5},
		{Op: OpNorm, M: 1, N: 64, Seconds: 1},
		{Op: OpRope, M: 1, N: 64, Refused: "no"},
	}}
	b := Unit{LaunchSeconds: 1e-5, GBs: 8, Entries: []Entry{
		{Op: OpMatMul, DType: "q4_0", M: 1, K: 64, N: 64, Seconds: 2},
		{Op: OpMatMul, DType: "q4_0", M: 4, K: 64, N: 64, Seconds: 6},
		{Op: OpRope, M: 1, N: 64, Seconds: 0.5},
	}}
	a.keepLeast(b)
	assert.Equal(t, 1e-5, a.LaunchSeconds)
	assert.Equal(t, 10.0, a.GBs)
	assert.Equal(t, []float64{2, 5, 1, 0}, []float64{a.Entries[0].Seconds, a.Entries[1].Seconds, a.Entries[2].Seconds, a.Entries[3].Seconds})
	assert.Equal(t, "no", a.Entries[3].Refused)
}
