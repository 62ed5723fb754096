package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
)

// testSchema nests objects, arrays, enums, numbers, a $ref and an anyOf; its strings, arrays
// and numbers are bounded so an answer fits in a short max_tokens.
const testSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer"},
    "mood": {"enum": ["happy", "sad", "sleepy"]},
    "tags": {"type": "array", "items": {"enum": ["red", "blue", 7]}, "minItems": 1, "maxItems": 3},
    "pos": {"$ref": "#/$defs/point"},
    "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]},
    "score": {"type": "number"}
  },
  "required": ["name", "age", "mood", "tags", "pos", "pet"],
  "additionalProperties": false,
  "$defs": {
    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
              "required": ["x", "y"], "additionalProperties": false},
    "pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "legs": {"type": "integer"}},
            "required": ["kind"], "additionalProperties": false}
  }
}`

// ajvValidate checks texts against schema with ajv (node, build/npm), skipping when absent.
func ajvValidate(t *testing.T, schema string, texts []string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the schema check needs it (scripts/deps.sh installs it)")
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules", "ajv", "package.json")); err != nil {
		t.Skipf("the ajv npm package is not in %s: run scripts/deps.sh (npm install --prefix build/npm ajv@8)", npmDir)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "ajv_validate.js"))
	require.NoError(t, err)
	in, err := json.Marshal(map[string]any{"schema": json.RawMessage(schema), "texts": texts})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "-e", string(script))
	cmd.Dir = npmDir // require("ajv") resolves from here
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "ajv: %s", stderr.String())
	var got struct {
		Checked  int
		Failures []struct {
			Index       int
			Text, Error string
		}
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Equal(t, len(texts), got.Checked)
	for _, f := range got.Failures {
		t.Errorf("answer %d does not validate: %s\n%s", f.Index, f.Error, f.Text)
	}
}

// 100 json_schema requests on the test model, sampled with different seeds, all parse and
// validate against the schema (ajv); json_object answers are JSON objects.
func TestJSONSchemaResponses(t *testing.T) {
	eng, err := llm.Load(context.Background(), storiesPath(t), llm.WithReferenceFallback(),
		llm.WithRunnerOptions(llm.WithContextLength(512)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	srv, err := New(context.Background(), eng, WithModelName("stories"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	const n = 100
	var texts []string
	tokens := 0
	for i := range n {
		path, prompt := "/v1/chat/completions", fmt.Sprintf(`"messages":[{"role":"user","content":"Tell me about pet %d."}]`, i)
		if i%2 == 1 {
			path, prompt = "/v1/completions", fmt.Sprintf(`"prompt":"Once upon a time, pet %d"`, i)
		}
		body := fmt.Sprintf(`{"model":"stories",%s,"max_tokens":400,"temperature":0.9,"seed":%d,
			"response_format":{"type":"json_schema","json_schema":{"name":"pet","schema":%s}}}`, prompt, i+1, testSchema)
		if i%10 == 0 {
			// every tenth streamed: the deltas add up to the answer
			text, finish, _ := streamChat(t, hs.URL, strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1))
			require.Equal(t, "stop", finish, "streamed answer %d ran out of tokens: %s", i, text)
			texts = append(texts, text)
			continue
		}
		code, b := post(t, hs.URL+path, body)
		require.Equal(t, 200, code, "%s", b)
		var resp struct {
			Choices []struct {
				Text         string
				Message      struct{ Content string }
				FinishReason string `json:"finish_reason"`
			}
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		require.NoError(t, json.Unmarshal(b, &resp), "%s", b)
		require.Len(t, resp.Choices, 1)
		c := resp.Choices[0]
		text := c.Text + c.Message.Content
		require.Equal(t, "stop", c.FinishReason, "answer %d ran out of tokens: %s", i, text)
		texts = append(texts, text)
		tokens += resp.Usage.CompletionTokens
	}
	t.Logf("%d answers, %d tokens; the first: %s", n, tokens, texts[0])
	distinct := map[string]bool{}
	for _, s := range texts {
		distinct[s] = true
	}
	assert.Greater(t, len(distinct), n/2, "seeds should give different answers")
	ajvValidate(t, testSchema, texts)

	code, b := post(t, hs.URL+"/v1/chat/completions", `{"model":"stories","max_tokens":200,"seed":3,
		"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, code, "%s", b)
	var resp struct {
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
	}
	require.NoError(t, json.Unmarshal(b, &resp))
	if resp.Choices[0].FinishReason == "stop" {
		var obj map[string]any
		assert.NoError(t, json.Unmarshal([]byte(resp.Choices[0].Message.Content), &obj), resp.Choices[0].Message.Content)
	}
}

// A schema the converter cannot take, or a response_format it does not know, is a 400 that
// names the parameter and says why.
func TestResponseFormatErrors(t *testing.T) {
	hs, _ := newTestServer(t)
	tests := []struct{ name, format, msg string }{
		{"unknown type", `{"type":"xml"}`, `"xml" is not supported`},
		{"no schema", `{"type":"json_schema","json_schema":{"name":"x"}}`, "needs json_schema.schema"},
		{"bad schema", `{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"string","pattern":"a+"}}}`,
			`person: grammar: json schema: at #: keyword "pattern" is not supported`},
		{"unknown schema type", `{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"strng"}}}`, `unknown type "strng"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := post(t, hs.URL+"/v1/chat/completions", `{"model":"stories","response_format":`+tt.format+`,
				"messages":[{"role":"user","content":"hi"}]}`)
			assert.Equal(t, 400, code)
			var e struct {
				Error struct{ Message, Param string }
			}
			require.NoError(t, json.Unmarshal(b, &e), "%s", b)
			assert.Contains(t, e.Error.Message, tt.msg)
			assert.Contains(t, e.Error.Param, "response_format")
		})
	}
}

// A repeated schema reuses its compiled grammar (and so the masks earlier answers computed);
// the cache keeps the most recent schemas only.
func TestGrammarCache(t *testing.T) {
	var c grammarCache
	a, err := c.get([]byte(testSchema))
	require.NoError(t, err)
	b, err := c.get([]byte(testSchema))
	require.NoError(t, err)
	assert.Same(t, a, b)
	for i := range maxCachedGrammars {
		_, err := c.get([]byte(fmt.Sprintf(`{"const":%d}`, i)))
		require.NoError(t, err)
	}
	assert.Len(t, c.byKey, maxCachedGrammars)
	b, err = c.get([]byte(testSchema))
	require.NoError(t, err)
	assert.NotSame(t, a, b, "the oldest schema was dropped")
	_, err = c.get([]byte(`{"type":"nope"}`))
	assert.Error(t, err)
	assert.Len(t, c.byKey, maxCachedGrammars, "a bad schema is not cached")
}
