package coresel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/sched/cputopo"
)

func simTrial(t *testing.T, name string, seed uint64, noiseless bool) (*SoC, *SimTrial) {
	t.Helper()
	soc, err := LoadSoC(name)
	require.NoError(t, err)
	tr, err := NewSimTrial(soc, seed, 50)
	require.NoError(t, err)
	tr.Noiseless = noiseless
	return soc, tr
}

// The paper's Table 7 selections, Fig. 5's Stage-1 stop and Fig. 6's five-node tree.
func TestTable7InSimulation(t *testing.T) {
	tests := []struct {
		soc      string
		fastest  string
		tree     []string
		treeSize int
	}{
		{"kirin9000", "1+2+0", []string{"1+2+0", "1+1+0", "1+0+0", "0+3+0", "0+2+0"}, 5},
		{"sd8gen3", "1+1+0+0", []string{"1+1+0+0", "1+0+0+0", "0+2+0+0", "0+1+1+0", "1+0+1+0", "0+0+2+0"}, 6},
	}
	for _, tt := range tests {
		t.Run(tt.soc, func(t *testing.T) {
			soc, tr := simTrial(t, tt.soc, 1, true)
			res, err := Tune(context.Background(), tr.Top, tr, WithFlatGovernor(!soc.IdleScaling))
			require.NoError(t, err)
			assert.Equal(t, tt.fastest, res.Fastest.Key(), "Stage 1")
			assert.Equal(t, soc.Paper.Selection, res.Decode.Key(), "decode selection (paper: %s)", soc.Paper.Words)
			assert.True(t, res.Modelled)
			if tt.tree != nil {
				var keys []string
				for _, n := range res.Tree {
					keys = append(keys, n.Key)
				}
				assert.Equal(t, tt.tree, keys)
			}
			assert.GreaterOrEqual(t, len(res.Tree), 4)
			assert.LessOrEqual(t, len(res.Tree), 9, "the paper's trees hold 4-9 candidates")
			best, _, err := Exhaustive(context.Background(), tr.Top, tr)
			require.NoError(t, err)
			assert.Equal(t, best.Key, res.Decode.Key(), "AECS agrees with the exhaustive search")
			assert.Equal(t, tr.Top.SpaceSize(), map[string]int{"kirin9000": 39, "sd8gen3": 71}[tt.soc])
		})
	}
}

// Under ±3 % energy noise the heuristic blend keeps the choice stable more often than measured
// energy alone (the paper's α = 0 ablation).
func TestNoiseRobustness(t *testing.T) {
	for _, name := range []string{"kirin9000", "sd8gen3"} {
		hits := map[float64]int{}
		const runs = 200
		for _, alpha := range []float64{0, 0.5} {
			for seed := uint64(1); seed <= runs; seed++ {
				soc, tr := simTrial(t, name, seed, false)
				res, err := Tune(context.Background(), tr.Top, tr, WithAlpha(alpha), WithFlatGovernor(!soc.IdleScaling))
				require.NoError(t, err)
				if res.Decode.Key() == soc.Paper.Selection {
					hits[alpha]++
				}
			}
		}
		t.Logf("%s: paper's selection in %d/%d runs with α=0.5, %d/%d with α=0", name, hits[0.5], runs, hits[0], runs)
		assert.GreaterOrEqual(t, hits[0.5], hits[0], name)
		assert.Greater(t, hits[0.5], runs*7/10, name)
	}
}

func TestTransformations(t *testing.T) {
	soc, err := LoadSoC("sd8gen3")
	require.NoError(t, err)
	top, err := soc.Topology()
	require.NoError(t, err)
	tu, err := newTuner(top, &SimTrial{}, nil)
	require.NoError(t, err)
	got := map[string]string{}
	for _, c := range tu.tree(cputopo.Selection{1, 2, 0, 0}) {
		got[c.sel.Key()] = fmt.Sprintf("%d%s<%s", c.level, c.transform, c.parent.Key())
	}
	assert.Equal(t, map[string]string{
		"1+1+0+0": "1a<1+2+0+0", "1+0+0+0": "1b<1+2+0+0", "0+3+0+0": "1c<1+2+0+0",
		"0+2+1+0": "1d<1+2+0+0", "1+0+2+0": "1d<1+2+0+0",
		"0+2+0+0": "2c<1+1+0+0", "0+1+1+0": "2d<1+1+0+0", "1+0+1+0": "2d<1+1+0+0",
		"0+1+2+0": "2c<0+2+1+0", "0+0+2+0": "2d<0+3+0+0",
	}, got)
	for k := range got {
		assert.NotContains(t, k[len(k)-1:], "1", "efficiency cores are never chosen (%s)", k)
	}
}

func TestThisMachineShape(t *testing.T) {
	top, err := cputopo.Read(cputopo.WithRoot("../cputopo/testdata/vm2"))
	require.NoError(t, err)
	// one cluster of two: Stage 1 tries 1 then 2 cores; the tree adds nothing new
	tr := &tableTrial{speed: map[string]float64{"1": 10, "2": 11}, joules: map[string]float64{"1": 1, "2": 1.6}}
	res, err := Tune(context.Background(), top, tr)
	require.NoError(t, err)
	assert.Equal(t, "2", res.Fastest.Key())
	assert.Equal(t, "2", res.Decode.Key(), "1 core is 9 % slower: outside ε")
	res, err = Tune(context.Background(), top, tr, WithEpsilon(0.1))
	require.NoError(t, err)
	assert.Equal(t, "1", res.Decode.Key())
	assert.Equal(t, 2, res.Trials)
	assert.Equal(t, "2", res.Prefill.Key())
}

type tableTrial struct {
	speed, joules map[string]float64
	fail          string
}

func (t *tableTrial) Measure(_ context.Context, s cputopo.Selection) (Measurement, error) {
	if s.Key() == t.fail {
		return Measurement{}, errors.New("boom")
	}
	return Measurement{TokPerSec: t.speed[s.Key()], JoulesPerToken: t.joules[s.Key()], Meter: "table"}, nil
}

func TestBadInput(t *testing.T) {
	top, err := cputopo.Read(cputopo.WithRoot("../cputopo/testdata/vm2"))
	require.NoError(t, err)
	good := &tableTrial{speed: map[string]float64{"1": 10, "2": 11}, joules: map[string]float64{"1": 1, "2": 1}}
	for _, o := range []Option{WithEpsilon(1), WithEpsilon(-0.1), WithAlpha(2)} {
		_, err := Tune(context.Background(), top, good, o)
		assert.Error(t, err)
	}
	_, err = Tune(context.Background(), nil, good)
	assert.Error(t, err)
	_, err = Tune(context.Background(), top, &tableTrial{speed: map[string]float64{"1": 10}, joules: map[string]float64{}, fail: "2"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "boom")
	_, err = Tune(context.Background(), top, &tableTrial{speed: map[string]float64{"1": -1}})
	assert.ErrorContains(t, err, "nonsense")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Tune(ctx, top, good)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = LoadSoC("nope")
	assert.ErrorIs(t, err, ErrUnknownSoC)
	_, err = ParseSoC([]byte(`{"name":"x","cpu":{"clusters":[{"type":"a","cores":0}]}}`))
	assert.Error(t, err)
	_, err = ParseSoC([]byte(`{"name":"x","bogus":1}`))
	assert.Error(t, err)
}

func TestStore(t *testing.T) {
	dir := t.TempDir()
	_, tr := simTrial(t, "kirin9000", 1, true)
	res, err := Tune(context.Background(), tr.Top, tr)
	require.NoError(t, err)
	fp := Fingerprint(tr.Top, "sim:kirin9000")
	assert.NotEqual(t, fp, Fingerprint(tr.Top, "sim:other"))
	rec, err := NewRecord(tr.Top, res, fp, "simulated:kirin9000", tr.Meter(), "x", 50)
	require.NoError(t, err)
	assert.Equal(t, "4,5", rec.DecodeCPUs)
	_, err = Load(dir, fp)
	require.ErrorIs(t, err, ErrNoRecord)
	path, err := Save(dir, rec)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, fp+".json"), path)
	back, err := Load(dir, fp)
	require.NoError(t, err)
	assert.Equal(t, rec.Decode, back.Decode)
	assert.Equal(t, rec.Result.Best.Key, back.Result.Best.Key)
	require.NoError(t, os.WriteFile(path, []byte("{"), 0o644))
	_, err = Load(dir, fp)
	assert.Error(t, err)
	_, err = Save(dir, Record{Fingerprint: "../x"})
	assert.Error(t, err)
}

func TestCacheDir(t *testing.T) {
	t.Setenv("XPU_CACHE_DIR", "/a")
	t.Setenv("XDG_CACHE_HOME", "/b")
	d, err := CacheDir()
	require.NoError(t, err)
	assert.Equal(t, "/a/aecs", d)
	t.Setenv("XPU_CACHE_DIR", "")
	d, err = CacheDir()
	require.NoError(t, err)
	assert.Equal(t, "/b/xpu/aecs", d)
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "/h")
	d, err = CacheDir()
	require.NoError(t, err)
	assert.Equal(t, "/h/.cache/xpu/aecs", d)
}

func TestFakeTreeMatchesDescription(t *testing.T) {
	for name, tree := range map[string]string{"kirin9000": "kirin9000", "sd8gen3": "sd8gen3"} {
		soc, err := LoadSoC(name)
		require.NoError(t, err)
		desc, err := soc.Topology()
		require.NoError(t, err)
		read, err := cputopo.Read(cputopo.WithRoot("../cputopo/testdata/" + tree))
		require.NoError(t, err)
		assert.Equal(t, desc.String(), read.String(), name)
		// the description's model runs on the topology read from the fake tree
		_, _, err = soc.Predict(read, read.Counts())
		require.NoError(t, err)
	}
}

func TestSoCPowerMeter(t *testing.T) {
	soc, err := LoadSoC("kirin9000")
	require.NoError(t, err)
	top, err := cputopo.Read(cputopo.WithRoot("../cputopo/testdata/kirin9000"))
	require.NoError(t, err)
	m, err := soc.PowerMeter(top, cputopo.Selection{0, 2, 0})
	require.NoError(t, err)
	assert.True(t, m.Modelled())
	assert.Contains(t, m.Name(), "model:soc kirin9000, 0+2+0")
	_, w, err := soc.Predict(top, cputopo.Selection{0, 2, 0})
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	time.Sleep(5 * time.Millisecond)
	r, err := m.Stop()
	require.NoError(t, err)
	assert.InDelta(t, w, r.Watts(), 1e-9)
	assert.True(t, r.Modelled)
	_, err = soc.PowerMeter(top, cputopo.Selection{0, 9, 0})
	assert.ErrorIs(t, err, cputopo.ErrBadSelection)
	vm, err := cputopo.Read(cputopo.WithRoot("../cputopo/testdata/vm2"))
	require.NoError(t, err)
	_, err = soc.PowerMeter(vm, cputopo.Selection{1})
	assert.ErrorContains(t, err, "not in SoC")
}

// TestLoadMeasured: what `xpu tune --energy` saves under MeasuredFingerprint in CacheDir is what
// LoadMeasured finds, per backend.
func TestLoadMeasured(t *testing.T) {
	t.Setenv("XPU_CACHE_DIR", t.TempDir())
	_, tr := simTrial(t, "kirin9000", 1, true)
	res, err := Tune(context.Background(), tr.Top, tr)
	require.NoError(t, err)
	_, _, err = LoadMeasured(tr.Top, "neon")
	require.ErrorIs(t, err, ErrNoRecord)
	rec, err := NewRecord(tr.Top, res, MeasuredFingerprint(tr.Top, "neon"), "measured", tr.Meter(), "x", 50)
	require.NoError(t, err)
	dir, err := CacheDir()
	require.NoError(t, err)
	saved, err := Save(dir, rec)
	require.NoError(t, err)
	back, path, err := LoadMeasured(tr.Top, "neon")
	require.NoError(t, err)
	assert.Equal(t, saved, path)
	assert.Equal(t, "4,5", back.DecodeCPUs)
	_, _, err = LoadMeasured(tr.Top, "other")
	require.ErrorIs(t, err, ErrNoRecord)
}
