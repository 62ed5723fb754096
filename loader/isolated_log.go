package loader

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/stats"
)

// byteCounter is a grpc stats handler counting request and answer payload bytes.
type byteCounter struct {
	calls, sent, recv, ringCalls atomic.Uint64
}

func (c *byteCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (c *byteCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (c *byteCounter) HandleConn(context.Context, stats.ConnStats) {}

func (c *byteCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch p := s.(type) {
	case *stats.Begin:
		c.calls.Add(1)
	case *stats.OutPayload:
		c.sent.Add(uint64(p.WireLength))
	case *stats.InPayload:
		c.recv.Add(uint64(p.WireLength))
	}
}

// ringLog keeps the child's last stderr lines for crash reports, and forwards each line to
// slog at debug level.
type ringLog struct {
	mu      sync.Mutex
	lines   []string
	partial []byte
	name    string
	written time.Time
	log     *slog.Logger // nil: slog.Default()
}

// settle waits (bounded) until no output arrived for a moment: a dying child's last words are
// still in the pipe when its exit is noticed.
func (r *ringLog) settle(quiet, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		idle := time.Since(r.written)
		r.mu.Unlock()
		if idle >= quiet {
			return
		}
		time.Sleep(quiet / 4)
	}
}

// reportLines is how many meaningful lines a crash report quotes.
const reportLines = 12

func (r *ringLog) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written = time.Now()
	r.partial = append(r.partial, b...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(r.partial[:i]), "\r")
		r.partial = r.partial[i+1:]
		if line == "" {
			continue
		}
		logOrDefault(r.log).Debug("plugin-host", "plugin", r.name, "line", line)
		// a Go crash dump runs to thousands of lines: keep only those that can say why
		if crashNoise.MatchString(line) {
			continue
		}
		r.lines = append(r.lines, line)
		if len(r.lines) > reportLines {
			r.lines = r.lines[len(r.lines)-reportLines:]
		}
	}
	return len(b), nil
}

// crashNoise matches the parts of a Go crash dump that say nothing about the cause: register
// values, goroutine headers and stack frames.
var crashNoise = regexp.MustCompile(`^(\t|[a-z0-9]{2,6}\s+0x[0-9a-f]+$|goroutine \d+|created by |[\w./*()\[\]-]+\(.*\)$|\.\.\.)`)

// last is the child's last meaningful lines: the signal or fatal error and the log lines
// before it, without the stack dump.
func (r *ringLog) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.lines
	if len(r.partial) > 0 && !crashNoise.Match(r.partial) {
		keep = append(keep[:len(keep):len(keep)], string(r.partial))
	}
	if len(keep) == 0 {
		return "(no output)"
	}
	return strings.Join(keep, "\n")
}

var _ io.Writer = (*ringLog)(nil)
