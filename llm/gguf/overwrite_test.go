package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// A file overwritten or truncated under an open File must not fault the process (SIGBUS on the
// next read of a lost page): the image is copied first, the File keeps its bytes and says it is
// Detached. Without the guard every case below kills the test binary.
func TestOverwriteUnderMapping(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard is Linux's (a read lease); elsewhere the mapping stays plain")
	}
	const n = 1 << 20 // several pages, so that truncation drops mapped ones
	payload := make([]byte, 4*n)
	for i := range payload {
		payload[i] = byte(i*7 + i>>12)
	}
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, path string)
	}{
		{"truncate", func(t *testing.T, path string) { require.NoError(t, os.Truncate(path, 0)) }},
		{"overwrite in place", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("not a gguf any more"), 0o644))
		}},
		{"shrink and rewrite", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			require.NoError(t, f.Truncate(4096))
			_, err = f.WriteAt(bytes.Repeat([]byte{0xff}, 4096), 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			var buf bytes.Buffer
			require.NoError(t, Write(&buf, []KeyValue{{"general.name", MustValue("overwrite")}},
				[]WriteTensor{{Name: "w", DType: core.F32, Shape: core.Shape{n}, Data: payload}}))
			require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
			f, err := Open(path)
			require.NoError(t, err)
			defer f.Close()
			if !f.Protected() {
				t.Skip("no read lease on this filesystem: the guard cannot apply (see mmap_linux.go)")
			}
			ti, ok := f.Tensor("w")
			require.True(t, ok)
			require.Equal(t, payload, f.TensorData(ti))
			assert.False(t, f.Detached())

			tc.write(t, path)

			assert.True(t, f.Detached())
			assert.Equal(t, payload, f.TensorData(ti), "the File reads the bytes it was opened with")
			assert.Equal(t, "overwrite", f.KV[0].Value.Any())
			// the file on disk is what the writer left
			st, err := os.Stat(path)
			require.NoError(t, err)
			assert.Less(t, st.Size(), int64(len(buf.Bytes())))
			// a fresh open sees the new file
			g, err := Open(path)
			if err == nil {
				g.Close()
			}
			assert.Error(t, err)
		})
	}
}

// Where no lease can be had (here: another descriptor holds the file open for writing), the
// File is not Protected, and Check reports the overwrite before anything reads the image.
func TestCheckUnprotected(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard is Linux's")
	}
	path := filepath.Join(t.TempDir(), "m.gguf")
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, nil, []WriteTensor{{Name: "w", DType: core.F32, Shape: core.Shape{4096}, Data: make([]byte, 4*4096)}}))
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer w.Close()
	f, err := Open(path)
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, f.Protected(), "a file open for writing elsewhere cannot be leased")
	require.NoError(t, f.Check())
	require.NoError(t, w.Truncate(100))
	err = f.Check()
	require.ErrorIs(t, err, ErrChanged)
	assert.Contains(t, err.Error(), "was overwritten since it was opened")
	assert.False(t, f.Detached())

	// a File from Parse owns its bytes: nothing to check
	p, err := Parse(buf.Bytes())
	require.NoError(t, err)
	assert.True(t, p.Protected())
	assert.NoError(t, p.Check())
}
