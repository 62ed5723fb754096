package llmbench

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm"
)

func TestTestNames(t *testing.T) {
	for _, c := range []struct {
		t    Test
		name string
		toks int
		ctx  int
	}{
		{Test{Prompt: 512}, "pp512", 512, 512},
		{Test{Gen: 128}, "tg128", 128, 128},
		{Test{Gen: 128, Depth: 1024}, "tg128 @ d1024", 128, 1152},
		{Test{Prompt: 512, Gen: 128}, "pp512+tg128", 640, 640},
		{Test{Prompt: 64, Depth: 8}, "pp64 @ d8", 64, 72},
	} {
		assert.Equal(t, c.name, c.t.Name())
		assert.Equal(t, c.toks, c.t.Tokens(), c.name)
		assert.Equal(t, c.ctx, c.t.ContextNeeded(), c.name)
		assert.NoError(t, c.t.Validate(), c.name)
	}
	for _, bad := range []Test{{}, {Prompt: -1, Gen: 2}, {Gen: 1, Depth: -1}, {Depth: 5}} {
		assert.ErrorIs(t, bad.Validate(), ErrInvalidTest, "%+v", bad)
	}
}

// Tests follows llama-bench's order and skips the zero lengths (-p 0 / -n 0).
func TestTestsExpansion(t *testing.T) {
	got := Tests([]int{128, 0, 512}, []int{0, 64}, [][2]int{{16, 4}}, []int{0, 100})
	want := []Test{
		{Prompt: 128}, {Prompt: 512}, {Gen: 64}, {Prompt: 16, Gen: 4},
		{Prompt: 128, Depth: 100}, {Prompt: 512, Depth: 100}, {Gen: 64, Depth: 100}, {Prompt: 16, Gen: 4, Depth: 100},
	}
	assert.Equal(t, want, got)
	assert.Equal(t, []Test{{Gen: 8}}, Tests([]int{0}, []int{8}, nil, nil), "no depths means depth 0")
	assert.Empty(t, Tests([]int{0}, []int{0}, nil, []int{0}))
}

// fixed is a result with known samples: 512 tokens in 1 s and in 2 s are 512 and 256 tok/s,
// mean 384, sample deviation 128·√2.
func fixed() Result {
	return Result{
		Model:   ModelInfo{Filename: "/m/llama-1b-q4_0.gguf", Type: "llama 975M Q4_0", Size: 548_800_000, Params: 975_240_000},
		Backend: "neon", Device: "neon:0", Threads: 2, Chunk: 32, KV: core.F16,
		Test:    Test{Prompt: 512},
		Time:    time.Date(2026, 11, 23, 16, 0, 0, 0, time.UTC),
		Samples: []time.Duration{time.Second, 2 * time.Second},
	}
}

func TestTokensPerSecond(t *testing.T) {
	mean, sd := fixed().TokensPerSecond()
	assert.InDelta(t, 384, mean, 1e-9)
	assert.InDelta(t, 181.019336, sd, 1e-5)
	one := fixed()
	one.Samples = one.Samples[:1]
	mean, sd = one.TokensPerSecond()
	assert.InDelta(t, 512, mean, 1e-9)
	assert.Zero(t, sd, "one repetition has no deviation")
}

func TestWriters(t *testing.T) {
	r := fixed()
	tg := fixed()
	tg.Test = Test{Gen: 128, Depth: 1024}
	tg.Samples = []time.Duration{4 * time.Second}

	t.Run("md", func(t *testing.T) {
		var b bytes.Buffer
		w, err := NewWriter("md", &b)
		require.NoError(t, err)
		require.NoError(t, w.Write(r))
		require.NoError(t, w.Write(tg))
		require.NoError(t, w.Flush())
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		require.Len(t, lines, 4)
		assert.Equal(t, "| model | size | params | device | threads | chunk | kv | test | t/s |", lines[0])
		assert.Equal(t, "| llama 975M Q4_0 | 523.38 MiB | 975.24 M | neon:0 | 2 | 32 | f16 | pp512 | 384.00 ± 181.02 |", lines[2])
		assert.Equal(t, "| llama 975M Q4_0 | 523.38 MiB | 975.24 M | neon:0 | 2 | 32 | f16 | tg128 @ d1024 | 32.00 ± 0.00 |", lines[3])
	})
	t.Run("json", func(t *testing.T) {
		var b bytes.Buffer
		w, err := NewWriter("json", &b)
		require.NoError(t, err)
		require.NoError(t, w.Write(r))
		require.NoError(t, w.Write(tg))
		assert.Zero(t, b.Len(), "the array is written whole at Flush")
		require.NoError(t, w.Flush())
		var recs []map[string]any
		require.NoError(t, json.Unmarshal(b.Bytes(), &recs))
		require.Len(t, recs, 2)
		// the fields bench/vs-llamacpp.sh reads, under llama-bench's names
		assert.EqualValues(t, 512, recs[0]["n_prompt"])
		assert.EqualValues(t, 0, recs[0]["n_gen"])
		assert.EqualValues(t, 1.5e9, recs[0]["avg_ns"])
		assert.InDelta(t, 384, recs[0]["avg_ts"], 1e-9)
		assert.InDelta(t, 181.019336, recs[0]["stddev_ts"], 1e-5)
		assert.Equal(t, []any{1e9, 2e9}, recs[0]["samples_ns"])
		assert.EqualValues(t, 1024, recs[1]["n_depth"])
		assert.EqualValues(t, 128, recs[1]["n_gen"])
		assert.Equal(t, "f16", recs[1]["type_k"])
		assert.Equal(t, "2026-11-23T16:00:00Z", recs[1]["test_time"])
	})
	t.Run("json empty", func(t *testing.T) {
		var b bytes.Buffer
		w, err := NewWriter("json", &b)
		require.NoError(t, err)
		require.NoError(t, w.Flush())
		assert.Equal(t, "[]\n", b.String())
	})
	t.Run("csv", func(t *testing.T) {
		var b bytes.Buffer
		w, err := NewWriter("csv", &b)
		require.NoError(t, err)
		require.NoError(t, w.Write(r))
		require.NoError(t, w.Write(tg))
		require.NoError(t, w.Flush())
		rows, err := csv.NewReader(&b).ReadAll()
		require.NoError(t, err)
		require.Len(t, rows, 3)
		col := map[string]int{}
		for i, h := range rows[0] {
			col[h] = i
		}
		assert.Equal(t, "512", rows[1][col["n_prompt"]])
		assert.Equal(t, "384.000000", rows[1][col["avg_ts"]])
		assert.Equal(t, "1000000000 2000000000", rows[1][col["samples_ns"]])
		assert.Equal(t, "1024", rows[2][col["n_depth"]])
		assert.Equal(t, "/m/llama-1b-q4_0.gguf", rows[2][col["model_filename"]])
	})
	_, err := NewWriter("xml", &bytes.Buffer{})
	assert.ErrorIs(t, err, ErrFormat)
}

func TestHumanSizes(t *testing.T) {
	assert.Equal(t, "975M", humanCount(975_240_000))
	assert.Equal(t, "1.2B", humanCount(1_235_814_400))
	assert.Equal(t, "7B", humanCount(7_000_000_000))
	assert.Equal(t, "293K", humanCount(292_800))
	assert.Equal(t, "1.12 MiB", humanBytes(1_171_200))
	assert.Equal(t, "4.00 GiB", humanBytes(4<<30))
	assert.Equal(t, "292.80 K", humanParams(292_800))
	assert.Equal(t, "1.24 B", humanParams(1_235_814_400))
}

func openStories(t *testing.T) *llm.Model {
	p := filepath.Join("..", "..", "..", "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("test model absent: %v", err)
	}
	m, err := llm.Open(p)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func TestMeasureOnStories(t *testing.T) {
	m := openStories(t)
	info := Describe("stories260K.gguf", m)
	assert.Equal(t, "llama 293K F32", info.Type)
	assert.Equal(t, int64(292_800), info.Params)
	assert.Greater(t, info.Size, int64(1<<20))

	ctx := context.Background()
	r, err := llm.NewRunner(ctx, m, ref.New().Devices()[0], llm.WithChunkSize(8), llm.WithContextLength(24))
	require.NoError(t, err)
	defer r.Close()
	for _, tc := range []Test{{Prompt: 12}, {Gen: 3, Depth: 9}, {Prompt: 5, Gen: 2, Depth: 17}} {
		samples, err := Measure(ctx, r, tc, Options{Reps: 2})
		require.NoError(t, err, tc.Name())
		require.Len(t, samples, 2)
		for _, s := range samples {
			assert.Positive(t, s)
		}
		assert.Zero(t, r.Len(), "the runner is left empty")
	}
	_, err = Measure(ctx, r, Test{Gen: 4}, Options{Reps: 1, NoWarmup: true})
	assert.NoError(t, err)

	_, err = Measure(ctx, r, Test{Prompt: 20, Depth: 5}, Options{Reps: 1})
	assert.ErrorIs(t, err, ErrInvalidTest, "25 tokens do not fit a context of 24")
	_, err = Measure(ctx, r, Test{Prompt: 4}, Options{})
	assert.ErrorIs(t, err, ErrInvalidTest, "no repetitions")
	_, err = Measure(ctx, r, Test{}, Options{Reps: 1})
	assert.ErrorIs(t, err, ErrInvalidTest)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = Measure(cancelled, r, Test{Prompt: 4}, Options{Reps: 1})
	assert.ErrorIs(t, err, context.Canceled)
}
