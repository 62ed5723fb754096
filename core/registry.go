package core

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Backends are found through one registry, as database/sql finds its drivers: a backend built
// into the binary (core/ref, plugins/coreml) registers itself in its package's init, so an
// application gets it by importing the package; the backends of plugin files come from the
// Source the plugin loader registers when it is imported. Code above this layer (the
// scheduler, the LLM runtime, the CLI) opens backends by name through OpenBackend and lists
// devices through the Source, and names no backend package.

// BuiltIn is a backend compiled into the binary.
type BuiltIn struct {
	// Name is what OpenBackend and the CLI's --backend know it by.
	Name string
	// Open opens the backend.
	Open func(ctx context.Context) (Backend, error)
	// Probe says whether it can run here (score > 0) and why not; nil: always (score 1).
	Probe func() (score int, reason string)
	// Settings are the process-wide settings Set accepts (none when Set is nil).
	Settings []Setting
	// Set changes a setting before the backend opens.
	Set func(key, value string) error
}

// Setting is one process-wide setting of a built-in backend.
type Setting struct {
	Key     string
	Values  []string // the values it accepts
	Default string   // the value when none is set
	Doc     string
}

// Source lists and opens the backends that are not built in: the plugin loader's discovery.
type Source interface {
	// OpenBackend opens the backend of a name ("neon": the best plugin found) or a plugin file.
	OpenBackend(ctx context.Context, nameOrPath string) (Backend, error)
	// Lazy lists every device discovery finds without opening the plugins.
	Lazy(ctx context.Context) (LazyDevices, error)
}

// LazyDevices are devices listed before their backends open (as their plugins last described
// them); Open opens a device's backend on first use.
type LazyDevices interface {
	// Devices lists every device.
	Devices() []Device
	// Open opens d's backend, once, and returns the live device.
	Open(ctx context.Context, d Device) (Device, error)
	// Backends lists the backends opened so far; the caller closes them.
	Backends() []Backend
}

var registry struct {
	mu       sync.RWMutex
	builtIns map[string]BuiltIn
	source   Source
}

// Register makes a built-in backend available by name. It panics, as database/sql.Register
// does, when the name is empty or taken or Open is nil: a programming error, found at init.
func Register(b BuiltIn) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if b.Name == "" || b.Open == nil {
		panic("core: Register of a backend without a name or Open")
	}
	if _, dup := registry.builtIns[b.Name]; dup {
		panic("core: Register called twice for backend " + b.Name)
	}
	if registry.builtIns == nil {
		registry.builtIns = map[string]BuiltIn{}
	}
	registry.builtIns[b.Name] = b
}

// Lookup returns the built-in backend registered under name.
func Lookup(name string) (BuiltIn, bool) {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	b, ok := registry.builtIns[name]
	return b, ok
}

// BuiltIns lists the registered built-in backends by name.
func BuiltIns() []BuiltIn {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	out := make([]BuiltIn, 0, len(registry.builtIns))
	for _, b := range registry.builtIns {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b BuiltIn) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RegisterSource sets the source of plugin backends (the plugin loader calls it in its init).
// It panics when one is set already.
func RegisterSource(s Source) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if s == nil || registry.source != nil {
		panic("core: RegisterSource called twice or with nil")
	}
	registry.source = s
}

// DefaultSource is the registered source of plugin backends; nil when no loader is linked in.
func DefaultSource() Source {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return registry.source
}

// OpenBackend opens a backend: a built-in one by name, else through src (the registered source
// when src is nil).
func OpenBackend(ctx context.Context, src Source, nameOrPath string) (Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b, ok := Lookup(nameOrPath); ok {
		return b.Open(ctx)
	}
	if src == nil {
		src = DefaultSource()
	}
	if src == nil {
		return nil, fmt.Errorf("backend %q: not built in, and no plugin loader is linked in (import github.com/xpuhub/xpu/loader): %w",
			nameOrPath, ErrNotFound)
	}
	return src.OpenBackend(ctx, nameOrPath)
}

// SetBackendSetting changes a process-wide setting of a built-in backend (before it opens).
func SetBackendSetting(name, key, value string) error {
	b, ok := Lookup(name)
	if !ok {
		return fmt.Errorf("backend %q: not built in: %w", name, ErrNotFound)
	}
	i := slices.IndexFunc(b.Settings, func(s Setting) bool { return s.Key == key })
	if b.Set == nil || i < 0 {
		return fmt.Errorf("backend %q has no setting %q: %w", name, key, ErrNotFound)
	}
	if vs := b.Settings[i].Values; len(vs) > 0 && !slices.Contains(vs, value) {
		return fmt.Errorf("backend %q setting %s=%q: want one of %s: %w", name, key, value,
			strings.Join(vs, ", "), ErrInvalidArgument)
	}
	return b.Set(key, value)
}
