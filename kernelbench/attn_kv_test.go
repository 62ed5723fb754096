package kernelbench

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// BenchmarkAttentionDecodeKV: one decode row of attention at depth 1024 and 4096 over a KV
// cache of each dtype a model can keep (f32, f16, and op set 5's Q8_0 and Q4_0, read natively),
// for the 1B model's heads (32 query heads of 64 over 8 KV heads) and 128-wide heads, in GB/s
// of the K and V bytes the row must read: at the same GB/s a cache half the bytes decodes in
// half the time. The cache is zeros (the time does not depend on the values); at these depths
// it stays in the last-level cache between runs, where a model's decode finds it evicted by the
// weights, so the figures are an upper bound of what decode sees.
func BenchmarkAttentionDecodeKV(b *testing.B) {
	const hq, hkv = 32, 8
	for _, d := range []int64{64, 128} {
		for _, depth := range []int64{1024, 4096} {
			for _, dt := range []core.DType{core.F32, core.F16, core.Q8_0, core.Q4_0} {
				b.Run(fmt.Sprintf("d%d/depth%d/%s", d, depth, dt), func(b *testing.B) {
					run, kvBytes, done := attentionDecodeRun(b, hq, hkv, d, depth, dt)
					defer done()
					reportGBs(b, kvBytes, timed(b, run))
				})
			}
		}
	}
}

// attentionDecodeRun prepares one decode row of attention at position depth-1 over a [depth,
// hkv, d] K and V cache of dtype dt on the NEON device; it returns the run, the bytes of K
// and V the row reads and the release.
func attentionDecodeRun(b *testing.B, hq, hkv, d, depth int64, dt core.DType) (func(), int64, func()) {
	ctx := context.Background()
	g := core.NewGraph()
	q := g.Input("q", core.F32, 1, hq, d)
	k := g.Input("k", dt, depth, hkv, d)
	v := g.Input("v", dt, depth, hkv, d)
	g.Output(g.Attention(q, k, v, core.AttentionOptions{Causal: true, QOffset: depth - 1}))
	require.NoError(b, g.Err())
	cctx, err := device(b, "neon").NewContext(ctx, map[string]string{"threads": strconv.Itoa(threads())})
	require.NoError(b, err)
	exe, err := cctx.Prepare(ctx, g)
	require.NoError(b, err)
	ex, err := exe.NewExecution()
	require.NoError(b, err)
	kv := dt.Bytes(depth * hkv * d)
	var bufs []core.Buffer
	for io, size := range []int64{4 * hq * d, kv, kv, 4 * hq * d} {
		buf, err := cctx.Alloc(size, core.BufferDevice)
		require.NoError(b, err)
		require.NoError(b, ex.Bind(io, buf, 0))
		bufs = append(bufs, buf)
	}
	done := func() {
		_ = ex.Close()
		_ = exe.Close()
		for _, buf := range bufs {
			_ = buf.Close()
		}
		_ = cctx.Close()
	}
	return func() { require.NoError(b, ex.Run(ctx)) }, 2 * kv, done
}
