package shmem

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Two mappings of one fd see each other's writes: what every user of the package relies on.
func TestNewFDShared(t *testing.T) {
	for _, o := range []Options{{}, {Sealed: true}} {
		fd, err := NewFD("xpu-shmem-test", 8192, o)
		require.NoError(t, err)
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		require.EqualValues(t, 8192, st.Size)
		a, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		require.NoError(t, err)
		b, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		require.NoError(t, err)
		a[4097] = 42
		require.Equal(t, byte(42), b[4097])
		if o.Sealed {
			require.Error(t, unix.Ftruncate(fd, 4096), "a sealed fd cannot shrink under a mapping")
		}
		require.NoError(t, unix.Munmap(a))
		require.NoError(t, unix.Munmap(b))
		require.NoError(t, unix.Close(fd))
	}
}
