package safefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
)

// Every kind of path comes back within a deadline: a FIFO with no writer is refused, not
// waited on.
func TestOpenAndReadFile(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "reg.json")
	require.NoError(t, os.WriteFile(reg, []byte(`{"a":1}`), 0o644))
	fifo := filepath.Join(dir, "fifo.json")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))
	link := filepath.Join(dir, "link.json")
	require.NoError(t, os.Symlink(fifo, link))
	for _, tc := range []struct {
		name, path string
		want       error  // nil: the bytes come back
		says       string // in the error
	}{
		{"regular", reg, nil, ""},
		{"fifo", fifo, ErrNotRegular, "named pipe (FIFO), not a regular file"},
		{"symlink to a fifo", link, ErrNotRegular, "named pipe (FIFO)"},
		{"directory", dir, ErrNotRegular, "a directory"},
		{"character device", "/dev/null", ErrNotRegular, "a character device"},
		{"missing", filepath.Join(dir, "none"), fs.ErrNotExist, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				b   []byte
				err error
			}
			done := make(chan result, 1)
			go func() {
				b, err := ReadFile(tc.path)
				done <- result{b, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadFile(%s) blocked", tc.path)
			}
			if tc.want == nil {
				require.NoError(t, r.err)
				assert.Equal(t, `{"a":1}`, string(r.b))
				return
			}
			require.ErrorIs(t, r.err, tc.want)
			assert.Contains(t, r.err.Error(), tc.says)
			if errors.Is(tc.want, ErrNotRegular) {
				assert.ErrorIs(t, r.err, core.ErrInvalidArgument)
				assert.Contains(t, r.err.Error(), tc.path)
				assert.ErrorIs(t, Check(tc.path), ErrNotRegular)
			}
		})
	}
	assert.NoError(t, Check(reg))
	assert.NoError(t, Check(filepath.Join(dir, "none")), "a missing path is the caller's open to report")
}

// The file Open returns is back in blocking mode, as os.Open's, and reads like one.
func TestOpenBlockingMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("abc"), 0o644))
	f, err := Open(p)
	require.NoError(t, err)
	defer f.Close()
	rc, err := f.SyscallConn() // f.Fd() would itself switch the descriptor to blocking
	require.NoError(t, err)
	var fl int
	var ferr error
	require.NoError(t, rc.Control(func(fd uintptr) { fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
	require.NoError(t, ferr)
	assert.Zero(t, fl&unix.O_NONBLOCK)
	b := make([]byte, 3)
	n, err := f.ReadAt(b, 0)
	require.NoError(t, err)
	assert.Equal(t, "abc", string(b[:n]))
}
