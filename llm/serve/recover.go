package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm"
)

// recovery is the server's way back from a crashed backend (an isolated plugin host that
// died): restart the backend once per crash, then rebuild each runner made from the dead
// process before it runs again.
type recovery struct {
	mu          sync.Mutex    // one rebuild at a time: a restart must not race a runner's rebuild
	epoch       atomic.Uint64 // backend restarts so far; a slot built before the last one is stale
	restarts    atomic.Int64
	broken      atomic.Int64 // slots waiting for a rebuild
	lastRestart atomic.Pointer[time.Time]
	lastCrash   atomic.Pointer[string]

	ctx    context.Context // ends the background rebuilds (Close)
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// crashed says err comes from a backend that died: the runner that returned it is broken.
func crashed(err error) bool { return errors.Is(err, core.ErrBackendCrashed) }

// noteCrash marks sl broken after err.
func (s *Server) noteCrash(sl *slot, err error) {
	if !sl.broken {
		sl.broken = true
		s.rec.broken.Add(1)
	}
	msg := err.Error()
	s.rec.lastCrash.Store(&msg)
	s.cfg.logger.Warn("serve: the backend crashed; rebuilding the runner", "err", err)
}

// stale says sl must be rebuilt before it runs: it crashed, the backend was restarted after
// it was built, or the backend died while nobody was using it.
func (s *Server) stale(sl *slot) bool {
	return sl.broken || sl.epoch != s.rec.epoch.Load() || s.eng.Healthy() != nil
}

// rebuild makes sl usable again: it restarts the backend unless that was done since sl's
// runner was built (and the new process is alive), then prepares sl's runner again.
func (s *Server) rebuild(ctx context.Context, sl *slot) error {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	if sl.epoch == s.rec.epoch.Load() || s.eng.Healthy() != nil {
		if err := s.eng.RestartBackends(ctx); err != nil {
			return err
		}
		s.rec.epoch.Add(1)
		s.rec.restarts.Add(1)
		now := time.Now()
		s.rec.lastRestart.Store(&now)
	}
	var r *llm.Runner
	if sl.engine {
		if err := s.eng.RebuildRunner(ctx); err != nil {
			return err
		}
		r = s.eng.Runner
	} else {
		_ = sl.r.Close() // a crashed backend cannot release what it held
		var err error
		if r, err = s.eng.NewRunner(ctx); err != nil {
			return fmt.Errorf("serve: rebuild a runner: %w", err)
		}
	}
	chat, err := llm.NewChat(r, s.cfg.chatOption...)
	if err != nil {
		if !sl.engine {
			_ = r.Close()
		}
		return err
	}
	sl.r, sl.chat, sl.epoch = r, chat, s.rec.epoch.Load()
	if sl.broken {
		sl.broken = false
		s.rec.broken.Add(-1)
	}
	s.cfg.logger.Debug("serve: runner rebuilt after a backend crash", "restarts", s.rec.restarts.Load())
	return nil
}

// recoverInBackground rebuilds sl until it works (waiting MaxRestartBackoff at most between
// attempts, doubling from the configured backoff) and then gives it back to the pool; Close
// stops it.
func (s *Server) recoverInBackground(sl *slot) {
	if !sl.broken {
		sl.broken = true
		s.rec.broken.Add(1)
	}
	s.rec.wg.Add(1)
	go func() {
		defer s.rec.wg.Done()
		defer s.slots.put(sl)
		wait := s.cfg.restartBackoff
		for {
			err := s.rebuild(s.rec.ctx, sl)
			if err == nil {
				return
			}
			s.cfg.logger.Warn("serve: rebuilding after a backend crash failed; trying again", "in", wait, "err", err)
			select {
			case <-s.rec.ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, MaxRestartBackoff)
		}
	}()
}

// modelChanged says whether the model file was replaced on disk since it was loaded: detached
// when the server still answers with the weights it loaded (the image was copied before the
// overwrite reached it), an error wrapping gguf.ErrChanged when it cannot (a file it could not
// protect, e.g. another user's or on NFS, that changed: reading its weights could fault).
func (s *Server) modelChanged() (detached bool, err error) {
	m := s.mdl
	if m == nil || m.File == nil {
		return false, nil
	}
	if err := m.File.Check(); err != nil {
		return false, err
	}
	return m.File.Detached(), nil
}
