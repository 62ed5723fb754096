package serve

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
)

// shiftServer serves stories260K with a 128-token context.
func shiftServer(t *testing.T, opts ...Option) *httptest.Server {
	ctx := context.Background()
	eng, err := llm.Load(ctx, storiesPath(t), llm.WithReferenceFallback(),
		llm.WithRunnerOptions(llm.WithContextLength(128)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	srv, err := New(ctx, eng, append([]Option{WithModelName("stories")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs
}

// TestContextShift: with WithContextShift a 300-token answer goes on past the 128-token
// context (llama-server's /completion with n_keep, and /v1/completions); without it the same
// request is refused for exceeding the context. EOS and BOS are biased away so that only the
// token budget ends the answer.
func TestContextShift(t *testing.T) {
	const noEnd = `"logit_bias":{"1":-100,"2":-100}`
	hs := shiftServer(t, WithContextShift())
	code, b := post(t, hs.URL+"/completion", `{"prompt":"Once upon a time","n_predict":300,"n_keep":16,"temperature":0.8,"seed":5,`+noEnd+`}`)
	require.Equal(t, 200, code, string(b))
	var c map[string]any
	require.NoError(t, json.Unmarshal(b, &c))
	assert.EqualValues(t, 300, c["tokens_predicted"])
	assert.Equal(t, "limit", c["stop_type"])

	code, b = post(t, hs.URL+"/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":300,"temperature":0,`+noEnd+`}`)
	require.Equal(t, 200, code, string(b))
	var oc struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &oc))
	assert.Equal(t, 300, oc.Usage.CompletionTokens)
	assert.Equal(t, "length", oc.Choices[0].FinishReason)

	code, b = post(t, hs.URL+"/completion", `{"prompt":"Once upon a time","n_predict":4,"n_keep":-2}`)
	assert.Equal(t, 400, code, string(b))
	assert.Contains(t, string(b), "n_keep")

	off := shiftServer(t)
	code, b = post(t, off.URL+"/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":300}`)
	assert.Equal(t, 400, code, string(b))
	assert.Contains(t, string(b), "context_length_exceeded")
}
