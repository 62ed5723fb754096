package llm

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// countHook counts the stages and projections a runner asks it for; with identity set it
// replaces every attn_output projection by its input (a shape-preserving rewrite whose
// effect shows in the logits), else it leaves every projection to the model.
type countHook struct {
	stages, linears int
	identity        bool
}

func (h *countHook) BeginStage() ProjectionBuilder { h.stages++; return h }

func (h *countHook) Linear(_ *core.Graph, x *core.Tensor, _ int, proj string) *core.Tensor {
	h.linears++
	if h.identity && proj == "attn_output" {
		return x
	}
	return nil
}

func TestProjectionHook(t *testing.T) {
	ctx := context.Background()
	m := synthModel(t, "qwen2", core.F32)
	dev := refDevice(t)
	prompt := []int32{1, 5, 9, 3}
	logits := func(t *testing.T, opts ...RunnerOption) []float32 {
		r, err := NewRunner(ctx, m, dev, append([]RunnerOption{WithContextLength(16), WithChunkSize(4)}, opts...)...)
		require.NoError(t, err)
		defer r.Close()
		out, err := r.Prefill(ctx, prompt)
		require.NoError(t, err)
		return out
	}
	plain := logits(t)
	for _, c := range []struct {
		name string
		hook *countHook
		same bool
	}{
		{"a hook that rewrites nothing keeps the logits", &countHook{}, true},
		{"a rewritten projection changes the logits", &countHook{identity: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := logits(t, WithProjectionHook(c.hook))
			if c.same {
				assert.Equal(t, plain, got)
			} else {
				assert.NotEqual(t, plain, got)
			}
			// every stage graph (the embedding, one per layer) of every prepared length
			assert.GreaterOrEqual(t, c.hook.stages, m.Config.Layers+1)
			// seven projections per layer and stage: q, k, v, output, gate, up, down
			assert.GreaterOrEqual(t, c.hook.linears, 7*m.Config.Layers)
		})
	}
	t.Run("a nil hook runs the model as it is", func(t *testing.T) {
		assert.Equal(t, plain, logits(t, WithProjectionHook(nil)))
	})
	t.Run("a reader is handed what it reads back", func(t *testing.T) {
		h := &readHook{got: map[int][]float32{}}
		logits(t, WithProjectionHook(h))
		require.Len(t, h.got, m.Config.Layers, "every layer's attn_q input is read back")
		for l, xs := range h.got {
			assert.Len(t, xs, len(prompt)*m.Config.Dim, "layer %d: one row per token of the chunk", l)
			assert.NotEqual(t, make([]float32, len(xs)), xs, "layer %d: the normed activations", l)
		}
	})
	t.Run("a reader's error fails the run", func(t *testing.T) {
		boom := errors.New("boom")
		r, err := NewRunner(ctx, m, dev, WithContextLength(16), WithChunkSize(4),
			WithProjectionHook(&readHook{got: map[int][]float32{}, fail: boom}))
		require.NoError(t, err)
		defer r.Close()
		_, err = r.Prefill(ctx, prompt)
		assert.ErrorIs(t, err, boom)
	})
	t.Run("hidden-state output refuses a hook", func(t *testing.T) {
		_, err := NewRunner(ctx, m, dev, WithHiddenOutput(), WithProjectionHook(&countHook{}))
		assert.ErrorIs(t, err, core.ErrUnsupported)
	})
}

// readHook reads back the input of every attn_q projection it sees (the model's own MATMUL
// builds it), recording the bytes handed back per layer; with fail set, Read fails.
type readHook struct {
	got  map[int][]float32
	fail error
}

func (h *readHook) BeginStage() ProjectionBuilder { return &readStage{h: h} }

type readStage struct {
	h      *readHook
	xs     []*core.Tensor
	layers []int
}

func (st *readStage) Linear(_ *core.Graph, x *core.Tensor, l int, proj string) *core.Tensor {
	if proj == "attn_q" {
		st.xs, st.layers = append(st.xs, x), append(st.layers, l)
	}
	return nil
}

func (st *readStage) ReadBack() []*core.Tensor { return st.xs }

func (st *readStage) Read(i int, data []byte) error {
	if st.h.fail != nil {
		return st.h.fail
	}
	st.h.got[st.layers[i]] = core.DecodeF32(data)
	return nil
}
