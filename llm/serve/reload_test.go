package serve

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/synth"
	"net/http/httptest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A model file replaced under a running server (a new download over the old one) never
// crashes it: with the read lease it goes on answering with the weights it loaded and /health
// says the file changed; without it (a writer already had the file open) every request gets a
// 503 naming the reason instead of reading weights that may fault.
func TestModelFileReplaced(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard is Linux's")
	}
	src, err := os.ReadFile(storiesPath(t))
	require.NoError(t, err)
	const req = `{"model":"stories","prompt":"Once upon a time","max_tokens":6,"temperature":0}`
	health := func(t *testing.T, url string) (int, map[string]any) {
		resp, err := http.Get(url + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var st map[string]any
		require.NoError(t, json.Unmarshal(b, &st), string(b))
		return resp.StatusCode, st
	}
	tests := []struct {
		name       string
		protected  bool
		wantCode   int
		wantHealth int
		want       string // in the request's answer
		wantState  string // in /health
	}{
		{"protected", true, http.StatusOK, http.StatusOK, `"text"`, "changed on disk"},
		{"unprotected", false, http.StatusServiceUnavailable, http.StatusServiceUnavailable, "model_changed", "file changed on disk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			require.NoError(t, os.WriteFile(path, src, 0o644))
			var w *os.File
			if !tc.protected {
				w, err = os.OpenFile(path, os.O_RDWR, 0) // a writer already there: no lease
				require.NoError(t, err)
				defer w.Close()
			}
			hs, srv := newServerAt(t, path)
			if tc.protected != srv.eng.Model().File.Protected() {
				t.Skip("no read lease on this filesystem")
			}
			code, before := post(t, hs.URL+"/v1/completions", req)
			require.Equal(t, http.StatusOK, code, string(before))
			hc, st := health(t, hs.URL)
			require.Equal(t, http.StatusOK, hc)
			require.NotContains(t, st, "model_file")
			require.Contains(t, metricsText(t, hs.URL), "\nxpu_model_file_changed 0\n")

			if w != nil {
				require.NoError(t, w.Truncate(0))
				_, err = w.WriteAt([]byte("GGUF garbage, half a download"), 0)
				require.NoError(t, err)
			} else {
				require.NoError(t, os.WriteFile(path, []byte("GGUF garbage, half a download"), 0o644))
			}

			code, after := post(t, hs.URL+"/v1/completions", req)
			assert.Equal(t, tc.wantCode, code, string(after))
			assert.Contains(t, string(after), tc.want)
			hc, st = health(t, hs.URL)
			assert.Equal(t, tc.wantHealth, hc)
			b, _ := json.Marshal(st)
			assert.Contains(t, string(b), tc.wantState)
			assert.Contains(t, metricsText(t, hs.URL), "\nxpu_model_file_changed 1\n")
		})
	}
}

func metricsText(t *testing.T, url string) string {
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// A Reloader loads the model again when its file is replaced on disk: requests go on being
// answered while the new file is written, the next ones use the new model, and a replacement
// that does not load (garbage) leaves the loaded weights serving and /health saying why.
func TestReloaderLoadsReplacedModel(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard that keeps the old weights while the file is rewritten is Linux's")
	}
	src, err := os.ReadFile(storiesPath(t))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "model.gguf")
	require.NoError(t, os.WriteFile(path, src, 0o644))
	open := func(ctx context.Context, extra ...Option) (*Server, *llm.Engine, error) {
		eng, err := llm.Load(ctx, path, llm.WithReferenceFallback(), llm.WithRunnerOptions(llm.WithContextLength(256)))
		if err != nil {
			return nil, nil, err
		}
		srv, err := New(ctx, eng, append([]Option{WithModelName("stories")}, extra...)...)
		if err != nil {
			_ = eng.Close()
			return nil, nil, err
		}
		return srv, eng, nil
	}
	rl, err := NewReloader(context.Background(), open)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, rl.Close()) })
	hs := httptest.NewServer(rl)
	t.Cleanup(hs.Close)
	const req = `{"model":"stories","prompt":"Once upon a time","max_tokens":2,"temperature":0}`
	code, b := post(t, hs.URL+"/v1/completions", req)
	require.Equal(t, http.StatusOK, code, string(b))
	dim := func() int { return rl.Server().Engine().Model().Config.Dim }
	require.Equal(t, 64, dim())
	healthOf := func() map[string]any {
		resp, err := http.Get(hs.URL + "/health")
		require.NoError(t, err)
		defer resp.Body.Close()
		var st map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		return st
	}

	spec, err := synth.Preset("llama", "6M", core.Q8_0, 7)
	require.NoError(t, err)
	require.NoError(t, synth.WriteFile(path, spec)) // over the mapped file
	deadline := time.Now().Add(30 * time.Second)
	for dim() != spec.Dim && time.Now().Before(deadline) {
		code, b := post(t, hs.URL+"/v1/completions", req) // a request notices the change
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, code, string(b))
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, spec.Dim, dim(), "the replaced file was not loaded within 30 s")
	code, b = post(t, hs.URL+"/v1/completions", req)
	require.Equal(t, http.StatusOK, code, string(b))
	st := healthOf()
	assert.Equal(t, "ok", st["status"])
	assert.EqualValues(t, 1, st["reloads"])
	assert.NotEmpty(t, st["last_reload"])
	resp, err := http.Get(hs.URL + "/metrics")
	require.NoError(t, err)
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(mb), "xpu_model_reloads_total 1")

	require.NoError(t, os.WriteFile(path, []byte("not a gguf file"), 0o644))
	deadline = time.Now().Add(10 * time.Second)
	for healthOf()["reload_error"] == nil && time.Now().Before(deadline) {
		code, b := post(t, hs.URL+"/v1/completions", req) // the copied weights still answer
		require.Equal(t, http.StatusOK, code, string(b))
		time.Sleep(50 * time.Millisecond)
	}
	st = healthOf()
	assert.Contains(t, st["reload_error"], "loading the changed model file")
	assert.Contains(t, st["model_file"], "until the new file loads")
	assert.EqualValues(t, 1, st["reloads"])
	assert.Equal(t, spec.Dim, dim(), "a file that does not load leaves the loaded model serving")
}
