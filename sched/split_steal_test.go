package sched

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// matmulNodes makes one MATMUL node per weight row count, all reading one input.
func matmulNodes(t *testing.T, rows ...int64) []*core.Node {
	t.Helper()
	const k = 32
	g := core.NewGraph()
	x := g.Input("x", core.F32, 1, k)
	for i, n := range rows {
		g.Output(g.MatMul(x, g.Const("w", core.F32, core.Shape{n, k}, make([]byte, n*k*4))))
		_ = i
	}
	require.NoError(t, g.Err())
	return g.Nodes
}

func TestStealChunks(t *testing.T) {
	for _, c := range []struct {
		name   string
		rows   []int64
		share  float64
		chunks int
	}{
		{"one 2048-row weight", []int64{2048}, 0.5, 8},
		{"q, k, v of a 1B layer as one range", []int64{2048, 512, 512}, 0.5, 8},
		{"too small to cut finely", []int64{96}, 0.5, 3},
		{"below one alignment", []int64{20}, 0.5, 1},
		{"unequal units", []int64{4096}, 0.82, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes := matmulNodes(t, c.rows...)
			chunks := stealChunks(nodes, c.share, stealFractions)
			require.Len(t, chunks, c.chunks)
			// every row of every node exactly once, in order, cuts aligned inside a node
			next := make([]int64, len(nodes))
			for _, segs := range chunks {
				require.NotEmpty(t, segs)
				for _, s := range segs {
					assert.Equal(t, next[s.node], s.r0, "node %d", s.node)
					assert.Greater(t, s.r1, s.r0)
					if s.r1 != c.rows[s.node] {
						assert.Zero(t, s.r1%rowAlign, "cut at row %d of node %d", s.r1, s.node)
					}
					next[s.node] = s.r1
				}
			}
			assert.Equal(t, c.rows, next)
		})
	}
	// biggest at the ends: the first and last chunk are a quarter of 2048 rows each
	chunks := stealChunks(matmulNodes(t, 2048), 0.5, stealFractions)
	assert.Equal(t, stealSegment{0, 0, 512}, chunks[0][0])
	assert.Equal(t, stealSegment{0, 1536, 2048}, chunks[len(chunks)-1][0])
	// in proportion to the share: a unit expected to do 82% starts with 41% of the rows, the
	// other with 9%, and the smallest chunks lie where their parts meet
	chunks = stealChunks(matmulNodes(t, 4096), 0.82, stealFractions)
	assert.Equal(t, stealSegment{0, 0, 1664}, chunks[0][0])
	assert.Equal(t, stealSegment{0, 3712, 4096}, chunks[len(chunks)-1][0])
	assert.Equal(t, int64(3360), chunks[3][0].r1, "the fronts meet at 82%, aligned")
}

func TestStealClaim(t *testing.T) {
	s := &stealState{n: 5, words: make([]atomic.Uint64, 2)}
	var got []int
	for _, side := range []int{0, 1, 0, 0, 1, 1, 0} {
		got = append(got, s.claim(0, 7, side))
	}
	assert.Equal(t, []int{0, 4, 1, 2, 3, -1, -1}, got, "front from 0 up, back from 4 down, -1 once all are taken")
	// a new epoch starts from none taken, without a reset
	assert.Equal(t, 4, s.claim(0, 8, 1))
	assert.Equal(t, 0, s.claim(0, 8, 0))
	// a late claim of an older epoch takes nothing and leaves the newer word alone
	assert.Equal(t, -1, s.claim(0, 7, 0))
	assert.Equal(t, 1, s.claim(0, 8, 0))
	// lanes are independent
	assert.Equal(t, 0, s.claim(1, 9, 0))
	assert.Equal(t, 2, s.claim(0, 8, 0))
}

// Two sides claiming at once take every chunk exactly once (run with -race).
func TestStealClaimConcurrent(t *testing.T) {
	s := &stealState{n: 9, words: make([]atomic.Uint64, 1)}
	for epoch := uint32(1); epoch <= 200; epoch++ {
		var mu sync.Mutex
		seen := make([]int, s.n)
		var wg sync.WaitGroup
		for side := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := s.claim(0, epoch, side); i >= 0; i = s.claim(0, epoch, side) {
					mu.Lock()
					seen[i]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for i, n := range seen {
			require.Equal(t, 1, n, "epoch %d chunk %d", epoch, i)
		}
	}
}

// TestStealManyChunksMerged: a stealing task of several rows wide enough for every fraction of
// stealFractionsRows has more pieces than one CONCAT takes; the merge CONCATs them in two
// levels and y is the unsplit one, bit for bit on the reference.
func TestStealManyChunksMerged(t *testing.T) {
	rt := twoRefUnits(t)
	for _, dt := range []core.DType{core.F32, core.Q4_0} {
		g := splitGraph(t, 37, 64, 2048, dt)
		wantY, wantZ, p0 := runSplit(t, rt, g, nil)
		gotY, gotZ, p := runSplit(t, rt, g, &NodeSplit{Strategy: SplitRows, Units: []int{0, 1}, Ratio: []float64{0.5, 0.5}, Steal: true})
		assert.Equal(t, wantY, gotY, "%s", dt)
		assert.Equal(t, wantZ, gotZ, "%s", dt)
		pieces := len(stealChunks([]*core.Node{g.Nodes[1]}, 0.5, stealFractionsRows))
		require.Greater(t, pieces, maxConcat, "the case must need two levels")
		var merge *progPart
		for _, pp := range p.stages[0].parts {
			if strings.Contains(pp.name, "merge") {
				merge = pp
			}
		}
		require.NotNil(t, merge)
		assert.Len(t, merge.Graph.Nodes, 3, "%d pieces: two CONCATs of adjacent pieces, then one of those", pieces)
		require.NoError(t, p.Close())
		require.NoError(t, p0.Close())
	}
}
