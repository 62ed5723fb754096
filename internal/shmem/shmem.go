// Package shmem makes the file descriptors that xpu shares memory through: the scheduler's
// arena, the isolated backends' buffers and the conformance suite's import cases all map an fd
// that another party (a plugin, a child process) can map too.
//
// On Linux that is a memfd (sealable, never on a filesystem). Elsewhere (darwin, the BSDs) it is
// a file created in the temporary directory and unlinked at once: the same fd semantics (mmap,
// ftruncate, fd passing over a unix socket) without a name that outlives the process.
package shmem

import "errors"

// ErrNoSeals is returned by NewFD when sealing was asked for where the system has no file
// seals; callers that can live without them retry unsealed.
var ErrNoSeals = errors.New("shmem: file seals are not available on this system")

// Options for NewFD.
type Options struct {
	// Sealed forbids shrinking or growing the file once made, so no party can turn the other's
	// mapped accesses into SIGBUS (Linux only; ErrNoSeals elsewhere).
	Sealed bool
}

// NewFD makes a shared-memory fd of size bytes, close-on-exec; name shows in /proc (Linux).
// The caller owns the fd.
func NewFD(name string, size int64, o Options) (int, error) { return newFD(name, size, o) }
