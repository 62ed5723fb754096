package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
)

// listenServer serves srv on a loopback port with its timeouts and connection limits, as
// xpu serve does.
func listenServer(t *testing.T, opts ...Option) (addr string, srv *Server, lim *limitListener) {
	t.Helper()
	ctx := context.Background()
	eng, err := llm.Load(ctx, storiesPath(t), llm.WithReferenceFallback(),
		llm.WithRunnerOptions(llm.WithContextLength(128)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = eng.Close() })
	srv, err = New(ctx, eng, append([]Option{WithModelName("stories")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer()
	lim = srv.Listener(ln).(*limitListener)
	go func() { _ = hs.Serve(lim) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String(), srv, lim
}

// raiseFileLimit lifts the soft open-file limit to want (not past the hard one) for the test,
// or skips the test when the hard limit is lower.
func raiseFileLimit(t *testing.T, want uint64) {
	t.Helper()
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur >= want {
		return
	}
	if lim.Max < want {
		t.Skipf("the open-file limit is %d (hard %d): this test needs %d (ulimit -n %d)", lim.Cur, lim.Max, want, want)
	}
	old := lim
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("cannot raise the open-file limit to %d: %v", want, err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// dialFrom connects to addr from the loopback address src (127.0.0.0/8 is all loopback), so
// that a test can be several clients.
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// legit makes one small completion from src and returns how long it took.
func legit(t *testing.T, src, addr string) time.Duration {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return dialFrom(src, addr)
	}}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	t0 := time.Now()
	resp, err := c.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories","prompt":"Once","max_tokens":2}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return time.Since(t0)
}

// Slow clients cannot hold the server: 1,000 connections trickling a body and 1,000 idle ones
// (500 that never send a byte, 500 kept alive after a request) are closed by the header, read
// and idle timeouts, and a legitimate request meanwhile answers within a second.
func TestSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 connections: not in -short")
	}
	const slow, silent, kept = 1000, 500, 500
	raiseFileLimit(t, 4096) // both ends of 2,000 connections live in this process
	const timeout = time.Second
	addr, _, _ := listenServer(t, WithHeaderTimeout(timeout), WithReadTimeout(timeout), WithIdleTimeout(timeout),
		WithWriteTimeout(timeout), WithMaxConns(2100), WithMaxConnsPerClient(0))

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(n int, first string) {
		for range n {
			c, err := dialFrom("127.0.0.1", addr)
			require.NoError(t, err)
			conns = append(conns, c)
			if first != "" {
				_, err = io.WriteString(c, first)
				require.NoError(t, err)
			}
		}
	}
	t0 := time.Now()
	dial(slow, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
	dial(silent, "")
	dial(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, c := range conns[slow+silent:] { // the kept-alive ones got their answer
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	t.Logf("%d connections open in %v", len(conns), time.Since(t0))

	// the trickle: one byte to each slow body every 100 ms, until the server closes it
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, c := range conns[:slow] {
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
				_, _ = io.WriteString(c, " ")
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	took := legit(t, "127.0.0.2", addr)
	assert.Less(t, took, time.Second, "a legitimate request while 2,000 slow connections are open")

	// every slow connection ends: read to EOF or a reset, well within a few timeouts
	closed := make(chan error, len(conns))
	deadline := time.Now().Add(5 * timeout)
	for _, c := range conns {
		go func() {
			_ = c.SetReadDeadline(deadline)
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				closed <- fmt.Errorf("still open after %v", time.Since(t0))
				return
			}
			closed <- nil
		}()
	}
	open := 0
	for range conns {
		if err := <-closed; err != nil {
			open++
		}
	}
	assert.Zero(t, open, "slow connections the timeouts did not close")
}

// Past the per-client limit a client's new connection is refused with 503 at once while other
// clients still get in; past the total limit everyone's is.
func TestConnectionLimits(t *testing.T) {
	addr, srv, lim := listenServer(t, WithMaxConns(5), WithMaxConnsPerClient(3))
	open := func() int {
		lim.mu.Lock()
		defer lim.mu.Unlock()
		return lim.open
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(src string) net.Conn {
		c, err := dialFrom(src, addr)
		require.NoError(t, err)
		held = append(held, c)
		return c
	}
	refused := func(c net.Conn) bool {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		b, err := io.ReadAll(c)
		require.NoError(t, err, "the refused connection is closed")
		return strings.HasPrefix(string(b), "HTTP/1.1 503")
	}
	for range 3 {
		hold("127.0.0.1")
	}
	assert.True(t, refused(hold("127.0.0.1")), "a 4th connection from one client")
	assert.Less(t, legit(t, "127.0.0.2", addr), 5*time.Second, "another client still gets in")
	require.Eventually(t, func() bool { return open() == 3 }, 5*time.Second, time.Millisecond,
		"the other client's connection is given back once closed")
	hold("127.0.0.3")
	hold("127.0.0.3") // 5 open
	assert.True(t, refused(hold("127.0.0.4")), "past the total limit")
	assert.EqualValues(t, 2, srv.met.refused.Load())
}

// The read timeout bounds a request's arrival only: a stream (and a whole answer) may take
// longer than it to generate.
func TestReadTimeoutSparesLongAnswers(t *testing.T) {
	const timeout = 200 * time.Millisecond
	addr, srv, _ := listenServer(t, WithReadTimeout(timeout), WithHeaderTimeout(timeout))
	srv.hooks.beforeSend = func(n int) {
		if n == 1 {
			time.Sleep(3 * timeout)
		}
	}
	_, finish, _ := streamChat(t, "http://"+addr, chatBody("Once upon a time", 6, true))
	assert.Equal(t, "length", finish)
	code, b := post(t, "http://"+addr+"/v1/completions", `{"model":"stories","prompt":"Once","max_tokens":4}`)
	assert.Equal(t, http.StatusOK, code, string(b))
}

// deadlineRecorder is a ResponseWriter that records the write deadlines set on it.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

// Each write and flush of a response moves the write deadline, so a long stream runs while a
// client that stops reading fails the next write after the write timeout.
func TestWriteDeadlinePerWrite(t *testing.T) {
	rec := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
	const d = time.Minute
	tw := newTimedWriter(rec, d)
	tw.WriteHeader(http.StatusOK)
	_, err := tw.Write([]byte("data: x\n\n"))
	require.NoError(t, err)
	require.NoError(t, http.NewResponseController(tw).Flush())
	require.Len(t, rec.deadlines, 4, "set at the start, then before the header, the write and the flush")
	for i, dl := range rec.deadlines {
		assert.WithinDuration(t, time.Now().Add(d), dl, 5*time.Second, "deadline %d", i)
	}
	assert.True(t, rec.Flushed)
}
