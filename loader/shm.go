package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/shmem"
)

// Shared memory for isolated backends: every buffer is a memfd that the host maps and passes to
// the child over a unix socket pair (SCM_RIGHTS); the child maps the same pages and hands them
// to the plugin. Reads and writes of tensor bytes are plain memory accesses on either side.

// shm is one memfd mapping. view is the buffer's bytes: the whole mapping, or the part from an
// import's offset.
type shm struct {
	fd   int
	mem  []byte
	view []byte
}

// newShm makes a shared-memory fd of size bytes, sealed where the system has seals (the seals
// stop either side from shrinking the file under the other's mapping, which would turn an
// access into SIGBUS), and maps it.
func newShm(size int64) (*shm, error) {
	fd, err := shmem.NewFD("xpu-buffer", size, shmem.Options{Sealed: true})
	if errors.Is(err, shmem.ErrNoSeals) {
		fd, err = shmem.NewFD("xpu-buffer", size, shmem.Options{})
	}
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, core.ErrOutOfMemory)
	}
	s, err := mapShm(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}

// mapShm maps size bytes of fd shared; the fd is kept (closed by close).
func mapShm(fd int, size int64) (*shm, error) { return mapShmRange(fd, 0, size) }

// mapShmRange maps [offset, offset+size) of fd (from 0, so that offset needs no page
// alignment); the fd is kept (closed by close).
func mapShmRange(fd int, offset, size int64) (*shm, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat fd %d: %v: %w", fd, err, core.ErrInvalidArgument)
	}
	if size <= 0 || offset < 0 || st.Size < offset || st.Size-offset < size {
		return nil, fmt.Errorf("fd %d has %d bytes, [%d,+%d) wanted: %w", fd, st.Size, offset, size,
			core.ErrInvalidArgument)
	}
	mem, err := unix.Mmap(fd, 0, int(offset+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap fd %d: %v: %w", fd, err, core.ErrOutOfMemory)
	}
	return &shm{fd: fd, mem: mem, view: mem[offset : offset+size]}, nil
}

func closeFD(fd int) { unix.Close(fd) }

// durationNS reads a timeout sent as uint64 nanoseconds (all ones: forever).
func durationNS(u uint64) time.Duration { return time.Duration(int64(u)) }

func (s *shm) close() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem, s.view = nil, nil
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// fdSender is the host end of the socket pair: each fd goes with an 8-byte id that the rpc
// naming the buffer carries, so the child matches fds and calls whatever their order.
type fdSender struct {
	mu   sync.Mutex
	sock int
	next uint64
}

func (s *fdSender) send(fd int) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := s.next
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	if err := unix.Sendmsg(s.sock, b[:], unix.UnixRights(fd), nil, 0); err != nil {
		return 0, fmt.Errorf("passing fd to the plugin process: %v: %w", err, core.ErrBackendCrashed)
	}
	return id, nil
}

// fdReceiver is the child end: a goroutine collects fds as they arrive. The child never
// writes on the socket: the parent's read of it returns only when the child is gone.
type fdReceiver struct {
	mu   sync.Mutex
	cond *sync.Cond
	fds  map[uint64]int
	err  error
	file *os.File // referenced so that its finalizer never closes the socket under us
	sock int
}

func newFDReceiver(sock *os.File) *fdReceiver {
	r := &fdReceiver{fds: map[uint64]int{}, file: sock, sock: int(sock.Fd())}
	r.cond = sync.NewCond(&r.mu)
	go r.loop()
	return r
}

func (r *fdReceiver) loop() {
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(r.sock, buf, oob, recvCloexec)
		if err == unix.EINTR {
			continue
		}
		var fds []int
		if err == nil && oobn > 0 {
			if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
				for _, m := range msgs {
					if rights, rerr := unix.ParseUnixRights(&m); rerr == nil {
						markCloexec(rights)
						fds = append(fds, rights...)
					}
				}
			}
		}
		r.mu.Lock()
		switch {
		case err != nil || n == 0:
			r.err = fmt.Errorf("fd socket closed: %v", err)
		case n == 8 && len(fds) == 1:
			r.fds[binary.LittleEndian.Uint64(buf)] = fds[0]
		default:
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
		done := r.err
		r.cond.Broadcast()
		r.mu.Unlock()
		if done != nil {
			// the parent is gone or gave up on this child: nobody is left to serve
			fmt.Fprintln(os.Stderr, "plugin-host:", done)
			os.Exit(3)
		}
	}
}

// take waits (bounded) for the fd sent with id.
func (r *fdReceiver) take(id uint64) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	timer := time.AfterFunc(10*time.Second, func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if fd, ok := r.fds[id]; ok {
			delete(r.fds, id)
			return fd, nil
		}
		if r.err != nil {
			return -1, r.err
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("fd %d never arrived", id)
		}
		r.cond.Wait()
	}
}
