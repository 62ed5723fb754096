package serve

import (
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the connection limits (see HTTPServer and Listener).
const (
	// DefaultHeaderTimeout bounds reading a request's headers.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request, headers and body: a client trickling
	// its body is cut off then.
	DefaultReadTimeout = 30 * time.Second
	// DefaultIdleTimeout is how long a kept-alive connection may wait for its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultWriteTimeout bounds each write of a response (each event of a stream): a client
	// that stops reading is dropped then, and its generation stops.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultMaxConns is the most connections open at once (beyond it a new one is answered
	// 503 and closed); keep it below the process's file limit.
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerClient is the most connections one client address may hold at once.
	DefaultMaxConnsPerClient = 256
)

// WithHeaderTimeout bounds reading a request's headers (default DefaultHeaderTimeout).
func WithHeaderTimeout(d time.Duration) Option { return func(c *config) { c.headerTimeout = d } }

// WithReadTimeout bounds reading a whole request, headers and body (default
// DefaultReadTimeout). It ends when the body is read: generating and streaming the answer are
// bounded by WithRequestTimeout and WithWriteTimeout.
func WithReadTimeout(d time.Duration) Option { return func(c *config) { c.readTimeout = d } }

// WithIdleTimeout is how long a kept-alive connection may wait for its next request (default
// DefaultIdleTimeout).
func WithIdleTimeout(d time.Duration) Option { return func(c *config) { c.idleTimeout = d } }

// WithWriteTimeout bounds each write of a response, each event of a stream included (default
// DefaultWriteTimeout): a client that stops reading is dropped, and its generation stops.
func WithWriteTimeout(d time.Duration) Option { return func(c *config) { c.writeTimeout = d } }

// WithMaxConns is the most connections Listener lets be open at once (default
// DefaultMaxConns; 0: no limit). A connection beyond it is answered 503 and closed at once,
// so that the server keeps accepting (and its health checks keep answering) instead of
// running out of file descriptors.
func WithMaxConns(n int) Option { return func(c *config) { c.maxConns = n } }

// WithMaxConnsPerClient is the most connections one client IP address may hold at once
// through Listener (default DefaultMaxConnsPerClient; 0: no limit): one client cannot take
// every connection. Behind a proxy every client has the proxy's address: raise it there.
func WithMaxConnsPerClient(n int) Option { return func(c *config) { c.maxConnsPerClient = n } }

// HTTPServer returns an http.Server for Handler with the server's header, read and idle
// timeouts (the write timeout is applied per write by Handler). Serve it on Listener(ln).
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{Handler: s.Handler(), ReadHeaderTimeout: s.cfg.headerTimeout,
		ReadTimeout: s.cfg.readTimeout, IdleTimeout: s.cfg.idleTimeout,
		ErrorLog: slog.NewLogLogger(s.cfg.logger.Handler(), slog.LevelWarn)}
}

// Listener wraps ln with the connection limits: WithMaxConns and WithMaxConnsPerClient.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, max: s.cfg.maxConns, perClient: s.cfg.maxConnsPerClient,
		byClient: map[string]int{}, refused: &s.met.refused}
}

// limitListener refuses connections past the total and per-client limits.
type limitListener struct {
	net.Listener
	max, perClient int
	refused        *atomic.Int64

	mu       sync.Mutex
	open     int
	byClient map[string]int
}

// refusal is what a refused connection reads before it is closed.
const refusal = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n" +
	"Content-Length: 21\r\n\r\ntoo many connections\n"

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(client); err == nil {
			client = host
		}
		l.mu.Lock()
		if (l.max > 0 && l.open >= l.max) || (l.perClient > 0 && l.byClient[client] >= l.perClient) {
			l.mu.Unlock()
			l.refused.Add(1)
			// a fresh socket's send buffer is empty: this write does not wait on the client
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = c.Write([]byte(refusal))
			_ = c.Close()
			continue
		}
		l.open++
		l.byClient[client]++
		l.mu.Unlock()
		return &limitConn{Conn: c, l: l, client: client}, nil
	}
}

func (l *limitListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byClient[client]--; l.byClient[client] <= 0 {
		delete(l.byClient, client)
	}
}

// limitConn gives its place back when closed.
type limitConn struct {
	net.Conn
	l      *limitListener
	client string
	once   sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.client) })
	return err
}

// timedWriter moves the connection's write deadline before each write and flush, so that a
// response (a long stream too) may take as long as it needs while each write must complete
// within the write timeout.
type timedWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func newTimedWriter(w http.ResponseWriter, d time.Duration) *timedWriter {
	t := &timedWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
	t.extend()
	return t
}

func (t *timedWriter) extend() { _ = t.rc.SetWriteDeadline(time.Now().Add(t.d)) }

func (t *timedWriter) WriteHeader(code int) { t.extend(); t.ResponseWriter.WriteHeader(code) }

func (t *timedWriter) Write(b []byte) (int, error) { t.extend(); return t.ResponseWriter.Write(b) }

// FlushError is what http.ResponseController.Flush calls.
func (t *timedWriter) FlushError() error { t.extend(); return t.rc.Flush() }

// Unwrap lets http.ResponseController reach the connection.
func (t *timedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }
