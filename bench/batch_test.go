package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// bench/batch.sh refuses bad settings with a clear message before it starts any server.
func TestBatchScriptSettings(t *testing.T) {
	out := t.TempDir()
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no xpu", []string{"XPU=/nonexistent/xpu", "OUT=" + out}, []string{"m.gguf"}, "no xpu binary"},
		{"no clients", []string{"XPU=/bin/true", "CLIENTS=0", "OUT=" + out}, []string{"m.gguf"}, "positive integers"},
		{"bad tokens", []string{"XPU=/bin/true", "TG=x", "OUT=" + out}, []string{"m.gguf"}, "positive integers"},
		{"no llama-server", []string{"XPU=/bin/true", "LLAMA_BIN=" + out, "OUT=" + out}, []string{"m.gguf"}, "no llama-server"},
		{"no model", []string{"XPU=/bin/true", "OUT=" + out}, []string{"/nonexistent/m.gguf"}, "no model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runBenchScript(t, "bench/batch.sh", time.Minute, tc.env, tc.args...)
			assert.Equal(t, 2, code, stderr)
			assert.Contains(t, stderr, tc.want)
		})
	}
}
