package qnn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// profileAnswer is what childProfile prints: the plugin's verdict on a W8A8 MATMUL and a
// QUANTIZE run against the reference, on the emulated HTP of the API version in the environment.
type profileAnswer struct {
	API          string  `json:"api"`
	W8A8         bool    `json:"w8a8"`
	W8A8Reason   string  `json:"w8a8_reason"`
	QuantizeNMSE float64 `json:"quantize_nmse"`
	Err          string  `json:"err,omitempty"`
}

func childProfile() int {
	ans, err := profileRun()
	if err != nil {
		ans.Err = err.Error()
	}
	return childAnswer(ans)
}

func profileRun() (profileAnswer, error) {
	var ans profileAnswer
	ctx := context.Background()
	b, cc, done, err := childContext(ctx)
	if err != nil {
		return ans, err
	}
	defer done()
	ans.API = b.Info().SDKVersion

	r := rand.New(rand.NewPCG(7, 8))
	const M, K, N = 4, 64, 24
	w := make([]byte, N*K)
	for i := range w {
		w[i] = byte(int8(r.IntN(255) - 127))
	}
	g := core.NewGraph()
	a := g.Input("a", core.I8, M, K)
	g.Output(g.MatMulW8A8(a, g.Const("w", core.I8, core.Shape{N, K}, w),
		core.W8A8Options{AScale: 0.02, BScale: 0.01, OutScale: 0.05}))
	vs, err := cc.Analyze(ctx, g)
	if err != nil {
		return ans, err
	}
	ans.W8A8, ans.W8A8Reason = vs[0].Supported, vs[0].Reason

	q := core.NewGraph()
	x := q.Input("x", core.F32, 3, K)
	q.Output(q.Quantize(x, core.I8, 0.05))
	inputs := [][]byte{core.EncodeF32(randf(r, 3*K, 2))}
	want, err := ref.Run(ctx, q, inputs)
	if err != nil {
		return ans, err
	}
	exe, err := cc.Prepare(ctx, q)
	if err != nil {
		return ans, fmt.Errorf("preparing QUANTIZE: %w", err)
	}
	defer exe.Close()
	tb := &childTB{}
	got := execute(tb, cc, exe, q, inputs)
	if tb.failed {
		return ans, fmt.Errorf("running QUANTIZE: %w", tb.err)
	}
	codes := func(b []byte) []float32 {
		out := make([]float32, len(b))
		for i, c := range b {
			out[i] = float32(int8(c))
		}
		return out
	}
	ans.QuantizeNMSE = nmse(codes(got[0]), codes(want[0]))
	return ans, nil
}

// The HTP op profile follows the QNN API version the backend reports: a backend older than
// SDK 2.39 (API 2.32) has no 16-bit MatMul output, so W8A8 MATMUL is refused at analyze rather
// than failing at prepare, and its Quantize reads FLOAT_16, which the plugin then feeds it; a
// newer one gets both. The emulator's HTP rules follow the version it claims.
func TestHTPProfileFollowsTheAPIVersion(t *testing.T) {
	emulated(t, openBackend(t))
	for _, tc := range []struct {
		version string
		w8a8    bool
	}{
		{"2.18", false}, // SDK 2.25, the pinned one
		{"2.31", false}, // not surely 2.39 yet
		{"2.33", true},  // SDK 2.44
	} {
		t.Run(tc.version, func(t *testing.T) {
			out, err := child(t, "profile", "XPU_QNN_EMU_API_VERSION="+tc.version, "XPU_QNN_EMU_PROFILE=htp")
			require.NoError(t, err, "%s", out)
			var ans profileAnswer
			require.NoError(t, json.Unmarshal(lastLine(out), &ans), "%s", out)
			require.Empty(t, ans.Err, "%s", out)
			assert.Contains(t, ans.API, "API "+tc.version)
			assert.Equal(t, tc.w8a8, ans.W8A8, ans.W8A8Reason)
			if !tc.w8a8 {
				assert.Contains(t, ans.W8A8Reason, "SDK 2.39")
			}
			assert.Less(t, ans.QuantizeNMSE, 1e-4, "QUANTIZE runs on either profile (a code off by one where half precision rounds x)")
		})
	}
}
