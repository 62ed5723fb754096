package llm

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/llm/gguf"
	"github.com/xpuhub/xpu/llm/sample"
)

// Overwriting or truncating the model file under a loaded model (a new download over the old
// one) never crashes the process: with the lease the runner goes on with the weights it loaded
// (the reference reads them in Go, neon{repack=0} in C, both from the mapping); without it,
// Generate refuses with gguf.ErrChanged before any weight is read.
func TestModelFileOverwritten(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard is Linux's")
	}
	src, err := os.ReadFile(storiesPath(t))
	require.NoError(t, err)
	ctx := context.Background()
	devices := map[string]func(t *testing.T) (core.Device, []RunnerOption){
		"ref": func(t *testing.T) (core.Device, []RunnerOption) {
			b := ref.New()
			t.Cleanup(func() { _ = b.Close() })
			return b.Devices()[0], nil
		},
		"neon{repack=0}": func(t *testing.T) (core.Device, []RunnerOption) {
			return pluginDevices(t, "neon")[0], []RunnerOption{WithContextOptions(map[string]string{"repack": "0"})}
		},
	}
	overwrite := map[string]func(t *testing.T, path string){
		"truncate": func(t *testing.T, path string) { require.NoError(t, os.Truncate(path, 0)) },
		"overwrite": func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("GGUF garbage, half a download"), 0o644))
		},
	}
	for dname, dev := range devices {
		for oname, write := range overwrite {
			t.Run(dname+"/"+oname, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "m.gguf")
				require.NoError(t, os.WriteFile(path, src, 0o644))
				m, err := Open(path)
				require.NoError(t, err)
				defer m.Close()
				if !m.File.Protected() {
					t.Skip("no read lease on this filesystem")
				}
				d, opts := dev(t)
				r, err := NewRunner(ctx, m, d, opts...)
				require.NoError(t, err)
				defer r.Close()
				gen := func() (Result, error) {
					return r.Generate(ctx, "Once upon a time", WithMaxTokens(24), WithSampler(sample.Config{}))
				}
				before, err := gen()
				require.NoError(t, err)

				write(t, path)

				assert.True(t, m.File.Detached())
				after, err := gen()
				require.NoError(t, err)
				assert.Equal(t, before.Text, after.Text)
			})
		}
	}

	t.Run("unprotected", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "m.gguf")
		require.NoError(t, os.WriteFile(path, src, 0o644))
		w, err := os.OpenFile(path, os.O_RDWR, 0) // a writer already there: no lease
		require.NoError(t, err)
		defer w.Close()
		m, err := Open(path)
		require.NoError(t, err)
		defer m.Close()
		require.False(t, m.File.Protected())
		b := ref.New()
		defer b.Close()
		r, err := NewRunner(ctx, m, b.Devices()[0])
		require.NoError(t, err)
		defer r.Close()
		_, err = r.Generate(ctx, "Once", WithMaxTokens(4))
		require.NoError(t, err)
		require.NoError(t, w.Truncate(0))
		_, err = r.Generate(ctx, "Once", WithMaxTokens(4))
		require.ErrorIs(t, err, gguf.ErrChanged)
		assert.Contains(t, err.Error(), "m.gguf was overwritten since it was opened")
	})
}
