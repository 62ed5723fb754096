package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/llm"
)

// OpenFunc loads the model and builds a Server on it. The Reloader calls it once at the start
// and again whenever the model file changes on disk; it must add opts to the Server's options.
type OpenFunc func(ctx context.Context, opts ...Option) (*Server, *llm.Engine, error)

// Reloader serves through a Server that it replaces when the model file under it is replaced
// on disk (a new download over the old one). Until the new file loads, the old Server goes on
// answering: with the weights it loaded where the file was guarded (Linux's read lease), with
// 503 model_changed where it was not. A load that fails (a file still being written, a corrupt
// one) is retried with backoff while the file stays changed. The old Server and its engine are
// closed once the requests that were using them have ended.
type Reloader struct {
	open OpenFunc
	info *reloadInfo
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	cur     *generation
	loading bool
	nextTry time.Time
	backoff time.Duration
	closed  bool
}

// generation is one Server with the engine it was built on, and the requests using it.
type generation struct {
	srv      *Server
	eng      *llm.Engine
	h        http.Handler
	inflight sync.WaitGroup
}

// reloadInfo is what every generation's /health and /metrics say of the reloads.
type reloadInfo struct {
	count   atomic.Int64
	last    atomic.Pointer[time.Time]
	lastErr atomic.Pointer[string] // the last failed load, nil after a successful one
}

// Reload backoff: the first wait after a failed load, and the longest.
const (
	reloadBackoffMin = time.Second
	reloadBackoffMax = time.Minute
)

// withReloadInfo makes a Server report the reloads of the Reloader that built it.
func withReloadInfo(ri *reloadInfo) Option { return func(c *config) { c.reload = ri } }

// NewReloader opens the first Server.
func NewReloader(ctx context.Context, open OpenFunc) (*Reloader, error) {
	r := &Reloader{open: open, info: &reloadInfo{}}
	srv, eng, err := open(ctx, withReloadInfo(r.info))
	if err != nil {
		return nil, err
	}
	r.ctx, r.stop = context.WithCancel(context.WithoutCancel(ctx))
	r.cur = &generation{srv: srv, eng: eng, h: srv.Handler()}
	return r, nil
}

// Server is the Server now answering (for its HTTPServer and Listener settings).
func (r *Reloader) Server() *Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur.srv
}

// ServeHTTP answers with the current Server, and starts a reload when its model file changed.
func (r *Reloader) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	g := r.cur
	g.inflight.Add(1) // under mu: a generation is waited for only after it stopped being current
	r.maybeReload(g)
	r.mu.Unlock()
	defer g.inflight.Done()
	g.h.ServeHTTP(w, req)
}

// maybeReload starts a load of the model file when it changed on disk and no load is under way
// or backing off. r.mu is held.
func (r *Reloader) maybeReload(g *generation) {
	if r.loading || r.closed || time.Now().Before(r.nextTry) {
		return
	}
	if detached, err := g.srv.modelChanged(); !detached && err == nil {
		return
	}
	r.loading = true
	r.wg.Add(1)
	go r.reload(g)
}

// reload builds the next generation and, once it is current, closes the old one after its last
// request.
func (r *Reloader) reload(old *generation) {
	defer r.wg.Done()
	srv, eng, err := r.open(r.ctx, withReloadInfo(r.info))
	r.mu.Lock()
	r.loading = false
	if err == nil && r.closed {
		err = errors.New("the server is closing")
	}
	if err != nil {
		r.backoff = min(max(2*r.backoff, reloadBackoffMin), reloadBackoffMax)
		r.nextTry = time.Now().Add(r.backoff)
		msg := fmt.Sprintf("loading the changed model file: %v (next try in %s)", err, r.backoff)
		r.info.lastErr.Store(&msg)
		r.mu.Unlock()
		if srv != nil {
			_ = srv.Close()
		}
		if eng != nil {
			_ = eng.Close()
		}
		return
	}
	r.backoff, r.nextTry = 0, time.Time{}
	r.cur = &generation{srv: srv, eng: eng, h: srv.Handler()}
	now := time.Now()
	r.info.count.Add(1)
	r.info.last.Store(&now)
	r.info.lastErr.Store(nil)
	r.mu.Unlock()
	old.close()
}

// close releases a generation once no request uses it.
func (g *generation) close() {
	g.inflight.Wait()
	_ = g.srv.Close()
	_ = g.eng.Close()
}

// Close stops a load under way and closes the current Server and its engine; call it after the
// HTTP server stopped sending requests.
func (r *Reloader) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.stop()
	r.wg.Wait()
	g := r.cur
	g.inflight.Wait()
	return errors.Join(g.srv.Close(), g.eng.Close())
}

// Engine is the engine the Server answers with.
func (s *Server) Engine() *llm.Engine { return s.eng }
