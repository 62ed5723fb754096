package loader

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

// Alive says whether be can still answer calls: nil for an in-process backend (its crash is the
// caller's crash), and for an isolated one whose child process is running; an error wrapping
// core.ErrBackendCrashed once the child has died or was killed, before any call noticed it. It
// is cheap (no call to the child): a health check may ask it on every request.
func Alive(be core.Backend) error { return core.Alive(be) }

// Alive is core.Liveness for an isolated backend: its child process runs.
func (b *isoBackend) Alive() error {
	pr, err := b.current()
	if err != nil {
		return err
	}
	if err := pr.deadErr(); err != nil {
		return err
	}
	if pr.gone.Load() || pr.client.Exited() {
		return fmt.Errorf("isolated %s: the plugin process exited: %w", b.cd.Name, core.ErrBackendCrashed)
	}
	return nil
}
