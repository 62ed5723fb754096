package serve

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

type embeddingReply struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Param *string `json:"param"`
	} `json:"error"`
}

// vectors reads the reply's embeddings, floats or base64.
func (r embeddingReply) vectors(t *testing.T) [][]float32 {
	t.Helper()
	var out [][]float32
	for i, d := range r.Data {
		require.Equal(t, i, d.Index)
		require.Equal(t, "embedding", d.Object)
		var v []float32
		var s string
		if json.Unmarshal(d.Embedding, &s) == nil {
			b, err := base64.StdEncoding.DecodeString(s)
			require.NoError(t, err)
			v = core.DecodeF32(b)
		} else {
			require.NoError(t, json.Unmarshal(d.Embedding, &v))
		}
		out = append(out, v)
	}
	return out
}

func unitNorm(v []float32) float64 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return math.Sqrt(ss)
}

// TestEmbeddings: /v1/embeddings takes a string, strings, token ids or lists of them, answers
// unit-length vectors of the model's width as floats or base64 with the prompt tokens in
// usage, and refuses bad requests by parameter.
func TestEmbeddings(t *testing.T) {
	hs, srv := newTestServer(t, WithParallel(2))
	dim := srv.mdl.Config.Dim
	ids := srv.tok.Encode("Once upon a time", true)
	idsJSON, _ := json.Marshal(ids)
	call := func(body string) (int, embeddingReply) {
		code, b := post(t, hs.URL+"/v1/embeddings", body)
		var r embeddingReply
		require.NoError(t, json.Unmarshal(b, &r), "%s", b)
		return code, r
	}
	code, one := call(`{"model": "stories", "input": "Once upon a time"}`)
	require.Equal(t, 200, code)
	ref := one.vectors(t)
	require.Len(t, ref, 1)
	require.Len(t, ref[0], dim)
	assert.InDelta(t, 1, unitNorm(ref[0]), 1e-5)
	assert.Equal(t, "list", one.Object)
	assert.Equal(t, "stories", one.Model)
	assert.Equal(t, len(ids), one.Usage.PromptTokens)
	assert.Equal(t, len(ids), one.Usage.TotalTokens)

	for _, tc := range []struct {
		name, input, format string
		n, first            int // inputs, and which of them is "Once upon a time"
	}{
		{"strings", `["Tom had a red ball.", "Once upon a time"]`, "", 2, 1},
		{"token ids", string(idsJSON), "", 1, 0},
		{"lists of token ids", fmt.Sprintf("[%s, [1, 2, 3]]", idsJSON), "", 2, 0},
		{"base64", `"Once upon a time"`, "base64", 1, 0},
		{"float named", `"Once upon a time"`, "float", 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model": "stories", "input": %s`, tc.input)
			if tc.format != "" {
				body += fmt.Sprintf(`, "encoding_format": %q`, tc.format)
			}
			code, r := call(body + "}")
			require.Equal(t, 200, code)
			vs := r.vectors(t)
			require.Len(t, vs, tc.n)
			assert.InDeltaSlice(t, ref[0], vs[tc.first], 1e-6, "the same text embeds the same")
			for _, v := range vs {
				assert.InDelta(t, 1, unitNorm(v), 1e-5)
			}
			if tc.n == 2 {
				assert.NotEqual(t, vs[0], vs[1])
			}
		})
	}

	long := make([]int, 300)
	for i := range long {
		long[i] = 1
	}
	longJSON, _ := json.Marshal(long)
	for _, tc := range []struct {
		name, body string
		code       int
		param      string
	}{
		{"no input", `{"model": "stories"}`, 400, "input"},
		{"wrong model", `{"model": "gpt-4", "input": "a"}`, 404, "model"},
		{"bad format", `{"model": "stories", "input": "a", "encoding_format": "int8"}`, 400, "encoding_format"},
		{"dimensions", `{"model": "stories", "input": "a", "dimensions": 7}`, 400, "dimensions"},
		{"no inputs", `{"model": "stories", "input": []}`, 400, "input"},
		{"empty ids", `{"model": "stories", "input": [[]]}`, 400, "input[0]"},
		{"bad id", `{"model": "stories", "input": [1, 99999]}`, 400, "input[0]"},
		{"too long", `{"model": "stories", "input": ` + string(longJSON) + `}`, 400, "input[0]"},
		{"not text", `{"model": "stories", "input": {"a": 1}}`, 400, "input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, r := call(tc.body)
			assert.Equal(t, tc.code, code)
			require.NotNil(t, r.Error)
			require.NotNil(t, r.Error.Param)
			assert.Equal(t, tc.param, *r.Error.Param)
		})
	}
}

// The openai npm client's embeddings, base64 (its default, decoded by the client) and float,
// are the server's.
func TestOpenAIClientEmbeddings(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (scripts/deps.sh installs it)")
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules", "openai")); err != nil {
		t.Skipf("the openai npm package is not in %s: run scripts/deps.sh", npmDir)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "openai_embeddings.mjs"))
	require.NoError(t, err)
	scriptPath := filepath.Join(npmDir, fmt.Sprintf("openai_embeddings_%d.mjs", os.Getpid()))
	require.NoError(t, os.WriteFile(scriptPath, script, 0o644))
	defer os.Remove(scriptPath)

	hs, srv := newTestServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, scriptPath, hs.URL+"/v1", "stories").Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("node client failed: %v\n%s", err, ee.Stderr)
	}
	require.NoError(t, err)
	type vec struct {
		Index     int
		Embedding []float32
	}
	var got struct {
		Object, Model string
		Usage         struct {
			PromptTokens int `json:"prompt_tokens"`
		}
		Base64, Float []vec
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, "list", got.Object)
	assert.Equal(t, "stories", got.Model)
	want := len(srv.tok.Encode("Once upon a time", true)) + len(srv.tok.Encode("Tom had a red ball.", true))
	assert.Equal(t, want, got.Usage.PromptTokens)
	require.Len(t, got.Base64, 2)
	require.Len(t, got.Float, 2)
	for i := range 2 {
		assert.Equal(t, i, got.Base64[i].Index)
		require.Len(t, got.Base64[i].Embedding, srv.mdl.Config.Dim)
		assert.InDeltaSlice(t, got.Float[i].Embedding, got.Base64[i].Embedding, 1e-6)
		assert.InDelta(t, 1, unitNorm(got.Base64[i].Embedding), 1e-5)
	}
}
