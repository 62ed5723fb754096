package loader

import (
	"context"

	"github.com/xpuhub/xpu/core"
)

// Source is the plugin backends discovery finds under a set of options, as the layers above
// the loader see them (core.Source): llm.Load ranks their devices and opens the one it uses.
type Source struct{ opts []Option }

// NewSource returns the source of the plugins Discover finds with opts (WithPaths, Isolated,
// WithValidation, ...).
func NewSource(opts ...Option) *Source { return &Source{opts: opts} }

// OpenBackend opens a backend by name or plugin path (Open).
func (s *Source) OpenBackend(ctx context.Context, nameOrPath string) (core.Backend, error) {
	return Open(ctx, nameOrPath, s.opts...)
}

// Lazy lists every usable plugin's devices without opening the plugins (OpenLazy).
func (s *Source) Lazy(ctx context.Context) (core.LazyDevices, error) { return OpenLazy(ctx, s.opts...) }

// importing the loader makes the plugins found with the default options (XPU_PLUGIN_PATH, the
// build folder, ...) the registry's plugin source
func init() { core.RegisterSource(NewSource()) }

var _ core.Source = (*Source)(nil)
