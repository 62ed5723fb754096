package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"

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
