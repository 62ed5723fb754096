package sched

import (
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
		m      int64
		chunks int
	}{
		{"one 2048-row weight", []int64{2048}, 0.5, 1, 8},
		{"q, k, v of a 1B layer as one range", []int64{2048, 512, 512}, 0.5, 1, 8},
		{"too small to cut finely", []int64{96}, 0.5, 1, 3},
		{"below one alignment", []int64{20}, 0.5, 1, 1},
		{"unequal units", []int64{4096}, 0.82, 1, 8},
		{"256 rows of a: the meeting band in 8 row pieces", []int64{4096}, 0.5, 256, 6 + 8},
		{"100 rows of a: 3 row pieces", []int64{4096}, 0.82, 100, 6 + 3},
		{"40 rows of a: too few to cut", []int64{4096}, 0.5, 40, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			nodes := matmulNodes(t, c.rows...)
			chunks := stealChunks(nodes, c.share, c.m)
			require.Len(t, chunks, c.chunks)
			// every weight row of every node times every row of a exactly once, cuts aligned
			// inside a node, the column bands in order
			seen := make([][]int, len(nodes))
			for j := range nodes {
				seen[j] = make([]int, c.rows[j]*c.m)
			}
			next := make([]int64, len(nodes))
			for _, segs := range chunks {
				require.NotEmpty(t, segs)
				for _, s := range segs {
					assert.Greater(t, s.r1, s.r0)
					if s.r1 != c.rows[s.node] {
						assert.Zero(t, s.r1%rowAlign, "cut at row %d of node %d", s.r1, s.node)
					}
					m0, m1 := int64(0), c.m
					if s.m1 > 0 {
						m0, m1 = s.m0, s.m1
						require.Len(t, segs, 1, "a row piece is a chunk of its own")
					}
					if m0 == 0 {
						assert.Equal(t, next[s.node], s.r0, "node %d", s.node)
						next[s.node] = s.r1
					}
					for r := s.r0; r < s.r1; r++ {
						for i := m0; i < m1; i++ {
							seen[s.node][r*c.m+i]++
						}
					}
				}
			}
			assert.Equal(t, c.rows, next)
			for j := range nodes {
				for i, v := range seen[j] {
					if v != 1 {
						t.Fatalf("node %d: weight row %d, row %d of a computed %d times", j, int64(i)/c.m, int64(i)%c.m, v)
					}
				}
			}
		})
	}
	// biggest at the ends: the first and last chunk are a quarter of 2048 rows each
	chunks := stealChunks(matmulNodes(t, 2048), 0.5, 1)
	assert.Equal(t, stealSegment{node: 0, r0: 0, r1: 512}, chunks[0][0])
	assert.Equal(t, stealSegment{node: 0, r0: 1536, r1: 2048}, chunks[len(chunks)-1][0])
	// in proportion to the share: a unit expected to do 82% starts with 41% of the rows, the
	// other with 9%, and the smallest chunks lie where their parts meet
	chunks = stealChunks(matmulNodes(t, 4096), 0.82, 1)
	assert.Equal(t, stealSegment{node: 0, r0: 0, r1: 1664}, chunks[0][0])
	assert.Equal(t, stealSegment{node: 0, r0: 3712, r1: 4096}, chunks[len(chunks)-1][0])
	assert.Equal(t, int64(3360), chunks[3][0].r1, "the fronts meet at 82%, aligned")
	// with 256 rows of a, the band around the meeting point goes in row pieces of 32
	chunks = stealChunks(matmulNodes(t, 4096), 0.5, 256)
	assert.Equal(t, stealSegment{node: 0, r0: 1792, r1: 2304, m0: 0, m1: 32}, chunks[3][0])
	assert.Equal(t, stealSegment{node: 0, r0: 1792, r1: 2304, m0: 224, m1: 256}, chunks[10][0])
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
