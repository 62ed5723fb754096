package cputopo

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadFakeTrees(t *testing.T) {
	type cl struct {
		cpus     []int
		khz, cap int
		typ, gov string
		eff      bool
	}
	tests := []struct {
		root    string
		freq    bool
		want    []cl
		space   int
		counts  string
		summary string
	}{
		{"sd8gen3", true, []cl{
			{[]int{7}, 3302400, 1024, "Cortex-X4", "walt", false},
			{[]int{2, 3, 4}, 3148800, 870, "Cortex-A720", "walt", false},
			{[]int{5, 6}, 2956800, 820, "Cortex-A720", "walt", false},
			{[]int{0, 1}, 2265600, 325, "Cortex-A520", "walt", true},
		}, 2*4*3*3 - 1, "1+3+2+2", "1×Cortex-X4@3.30GHz + 3×Cortex-A720@3.15GHz + 2×Cortex-A720@2.96GHz + 2×Cortex-A520@2.27GHz"},
		{"kirin9000", true, []cl{
			{[]int{7}, 3130000, 1024, "Cortex-A77", "schedutil", false},
			{[]int{4, 5, 6}, 2540000, 830, "Cortex-A77", "schedutil", false},
			{[]int{0, 1, 2, 3}, 2048000, 250, "Cortex-A55", "schedutil", true},
		}, 2*4*5 - 1, "1+3+4", "1×Cortex-A77@3.13GHz + 3×Cortex-A77@2.54GHz + 4×Cortex-A55@2.05GHz"},
		{"vm2", false, []cl{
			{[]int{0, 1}, 2300000, 1024, "Intel(R) Xeon(R) Processor", "", false},
		}, 2, "2", "2×Intel(R) Xeon(R) Processor@2.30GHz"},
	}
	for _, tt := range tests {
		t.Run(tt.root, func(t *testing.T) {
			top, err := Read(WithRoot(filepath.Join("testdata", tt.root)))
			require.NoError(t, err)
			assert.Equal(t, tt.freq, top.HasCPUFreq)
			require.Len(t, top.Clusters, len(tt.want))
			for i, w := range tt.want {
				c := top.Clusters[i]
				assert.Equal(t, w.cpus, c.CPUs, "cluster %d", i)
				assert.Equal(t, w.khz, c.MaxFreqKHz, "cluster %d", i)
				assert.Equal(t, w.cap, c.Capacity, "cluster %d", i)
				assert.Equal(t, w.typ, c.Type, "cluster %d", i)
				assert.Equal(t, w.gov, c.Governor, "cluster %d", i)
				assert.Equal(t, w.eff, c.Efficiency, "cluster %d", i)
				for _, id := range c.CPUs {
					assert.Equal(t, i, top.CPUs[id].Cluster)
				}
			}
			assert.Equal(t, tt.space, top.SpaceSize())
			all := top.Exhaustive()
			assert.Len(t, all, tt.space)
			seen := map[string]bool{}
			for _, s := range all {
				require.NoError(t, s.Validate(top))
				assert.False(t, seen[s.Key()], "duplicate %s", s.Key())
				seen[s.Key()] = true
			}
			assert.Equal(t, tt.counts, top.Counts().Key())
			assert.Equal(t, tt.summary, top.String())
		})
	}
}

func TestSelectionCPUsAndOptions(t *testing.T) {
	top, err := Read(WithRoot("testdata/kirin9000"))
	require.NoError(t, err)
	tests := []struct {
		key, cpus, threads, words string
	}{
		{"0+2+0", "4,5", "2", "2×Cortex-A77@2.54GHz"},
		{"1+2+0", "4,5,7", "3", "1×Cortex-A77@3.13GHz + 2×Cortex-A77@2.54GHz"},
		{"1+3+4", "0,1,2,3,4,5,6,7", "8", "1×Cortex-A77@3.13GHz + 3×Cortex-A77@2.54GHz + 4×Cortex-A55@2.05GHz"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			s, err := ParseSelection(top, tt.key)
			require.NoError(t, err)
			o, err := NeonOptions(top, s)
			require.NoError(t, err)
			assert.Equal(t, map[string]string{"cpus": tt.cpus, "threads": tt.threads}, o)
			assert.Equal(t, tt.words, s.Describe(top))
			ids, err := ParseCPUList(tt.cpus)
			require.NoError(t, err)
			back, err := SelectionOf(top, ids)
			require.NoError(t, err)
			assert.Equal(t, s, back)
		})
	}
	po, err := NeonPhaseOptions(top, Selection{1, 3, 0}, Selection{0, 2, 0})
	require.NoError(t, err)
	assert.Equal(t, "4", po.Context["threads"])
	assert.Equal(t, "4,5,6,7", po.Prefill["cpus"])
	assert.Equal(t, "4,5", po.Decode["cpus"])
}

func TestBadSelections(t *testing.T) {
	top, err := Read(WithRoot("testdata/vm2"))
	require.NoError(t, err)
	for _, key := range []string{"3", "0", "-1", "1+1", "x", ""} {
		_, err := ParseSelection(top, key)
		assert.ErrorIs(t, err, ErrBadSelection, key)
	}
	_, err = SelectionOf(top, []int{0, 5})
	require.ErrorIs(t, err, ErrBadSelection)
	assert.Contains(t, err.Error(), "CPU 5 is offline or absent (online: 0,1)")
	_, err = SelectionOf(top, nil)
	assert.ErrorIs(t, err, ErrBadSelection)
	for _, l := range []string{"", "a", "3-1", "1-", "-2"} {
		_, err := ParseCPUList(l)
		assert.ErrorIs(t, err, ErrBadSelection, l)
	}
	ids, err := ParseCPUList("4-5,0,5")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 4, 5}, ids)
}

func TestOfflineCPUAndUnreadableTree(t *testing.T) {
	_, err := Read(WithRoot(t.TempDir()))
	require.ErrorIs(t, err, ErrUnreadable)

	// cpu1 offline: it is not part of any cluster, and selecting it is an error
	root := t.TempDir()
	cpu := filepath.Join(root, "sys/devices/system/cpu")
	for _, d := range []string{"cpu0", "cpu1", "cpu2"} {
		require.NoError(t, os.MkdirAll(filepath.Join(cpu, d), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(cpu, d, "cpu_capacity"), []byte("1024\n"), 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(cpu, "online"), []byte("0,2\n"), 0o644))
	top, err := Read(WithRoot(root))
	require.NoError(t, err)
	require.Len(t, top.Clusters, 1)
	assert.Equal(t, []int{0, 2}, top.Clusters[0].CPUs)
	_, err = SelectionOf(top, []int{1})
	assert.ErrorIs(t, err, ErrBadSelection)

	require.NoError(t, os.WriteFile(filepath.Join(cpu, "online"), []byte("garbage\n"), 0o644))
	_, err = Read(WithRoot(root))
	assert.ErrorIs(t, err, ErrUnreadable)
}

func TestThisMachine(t *testing.T) {
	top, err := Read()
	if err != nil {
		t.Skipf("no readable topology here: %v", err)
	}
	assert.NotEmpty(t, top.Clusters)
	assert.Equal(t, len(top.Online), top.Counts().Cores())
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,5", "0", "", "1-", "7,7,7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseCPUList(s)
		if err != nil {
			return
		}
		back, err := ParseCPUList(FormatCPUList(ids))
		require.NoError(t, err)
		assert.Equal(t, ids, back)
	})
}
