// Package loader finds xpu backend plugins, probes each in a short-lived child process (so
// that a plugin that crashes or hangs in its constructor or probe cannot take the caller down;
// answers cached on disk), keeps the best one per backend name and opens it: in this process
// through purego (package abi), or isolated in a child process (`xpu plugin-host`, served over
// hashicorp/go-plugin with buffers in shared memory). "ref" is the built-in reference backend.
//
// The children are the running executable (or WithHostBinary, XPU_PLUGIN_HOST) started in
// plugin-host mode. Probe children need no wiring; a Go application that opens isolated
// backends or calls Inspect calls ServeIfPluginHost first thing in main (see hostmain.go).
package loader

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/xpuhub/xpu/internal/modroot"
)

// Environment variables the loader reads (unless WithoutEnv).
const (
	EnvPluginPath = "XPU_PLUGIN_PATH" // colon-separated plugin files or folders
	EnvIsolate    = "XPU_ISOLATE"     // comma-separated backend names to open isolated ("all": every one)
	// EnvProbeTimeout bounds each plugin's probe child ("2s"; default DefaultProbeTimeout, at
	// most MaxProbeTimeout).
	EnvProbeTimeout = "XPU_PROBE_TIMEOUT"
	// EnvValidate set to 1 opens every plugin backend with the ABI validation layer
	// (WithValidation), for applications that embed xpu.
	EnvValidate = "XPU_VALIDATE"
)

// MaxProbeTimeout caps XPU_PROBE_TIMEOUT: a probe is meant to be cheap (no SDK start), and a
// plugin that hangs would otherwise stall every start for as long as the variable says. A
// larger value is clamped with a warning.
const MaxProbeTimeout = 2 * time.Minute

// PluginGlob is the file name every plugin in a searched folder has.
const PluginGlob = "libxpu-*.so"

// Candidate is one plugin file discovery found, with what its probe said.
type Candidate struct {
	Path   string
	Name   string // backend name from the probe ("" when the probe failed)
	Score  int
	Reason string // the probe's reason; for a rejected candidate, why it was not chosen
	Err    error  // why the file cannot be used (missing, not a plugin, ABI mismatch, ...)
	Chosen bool   // the best usable candidate of its name
	Source string // where it was found: "explicit", "XPU_PLUGIN_PATH", "executable", "build"
}

// Option configures discovery and opening.
type Option func(*config)

type config struct {
	paths        []string
	env          bool
	defaults     bool
	isolated     bool
	isolateEnv   map[string]bool
	hostBinary   string
	hostChecksum []byte
	callTimeout  time.Duration
	execTimeout  time.Duration // isolated execution_run deadline (0: automatic)
	validate     bool          // install the ABI validation layer (abi.Validated)

	probeTimeout  time.Duration
	probeCache    string
	probeCacheSet bool
	rescan        bool
	logger        *slog.Logger
}

func newConfig(opts []Option) *config {
	c := &config{env: true, defaults: true}
	for _, o := range opts {
		o(c)
	}
	if c.env {
		c.isolateEnv = map[string]bool{}
		for _, n := range strings.Split(os.Getenv(EnvIsolate), ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.isolateEnv[n] = true
			}
		}
		if os.Getenv(EnvValidate) == "1" {
			c.validate = true
		}
		if v := os.Getenv(EnvProbeTimeout); v != "" && c.probeTimeout == 0 {
			if d, err := time.ParseDuration(v); err == nil && d > MaxProbeTimeout {
				logOrDefault(c.logger).Warn("loader: "+EnvProbeTimeout+" is above the maximum: clamped", "value", v, "max", MaxProbeTimeout)
				c.probeTimeout = MaxProbeTimeout
			} else if err == nil && d > 0 {
				c.probeTimeout = d
			} else {
				logOrDefault(c.logger).Warn("loader: ignoring a bad "+EnvProbeTimeout, "value", v)
			}
		}
	}
	return c
}

// WithPaths adds plugin files or folders searched before everything else.
func WithPaths(paths ...string) Option {
	return func(c *config) { c.paths = append(c.paths, paths...) }
}

// WithLogger sets the logger discovery and opening write to (default slog.Default()). The
// loader logs candidates and the isolated plugin host's output at Debug, plugins that fail to
// open at Warn, and nothing at Info.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// logOrDefault is l, or slog.Default() (read at the call, so a later SetDefault counts).
func logOrDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// WithValidation opens plugin backends with the ABI validation layer: every call the host
// makes and every answer the plugin gives is checked against the ABI's rules (handle
// lifetimes, buffer bounds, fence order, threading, analyze/prepare agreement, precision), in
// process and isolated alike; a broken rule is an error wrapping abi.ErrValidation that names
// the call and the rule. XPU_VALIDATE=1 does the same. Without it the layer is not installed.
func WithValidation() Option { return func(c *config) { c.validate = true } }

// WithoutEnv ignores XPU_PLUGIN_PATH, XPU_ISOLATE and XPU_VALIDATE.
func WithoutEnv() Option { return func(c *config) { c.env = false } }

// WithoutDefaultDirs searches only the explicit paths (and XPU_PLUGIN_PATH unless WithoutEnv),
// not <executable dir>/plugins and build/plugins.
func WithoutDefaultDirs() Option { return func(c *config) { c.defaults = false } }

// Isolated opens every plugin backend in a child process ("xpu plugin-host"), so that a
// crashing or hanging plugin cannot take the host down. XPU_ISOLATE=neon,qnn does the same per
// backend name. The backend is the same core.Backend either way.
func Isolated() Option { return func(c *config) { c.isolated = true } }

func (c *config) isolate(name string) bool {
	return c.isolated || c.isolateEnv[name] || c.isolateEnv["all"]
}

type searchDir struct {
	path, source string
}

// searchList is the discovery order: explicit, XPU_PLUGIN_PATH, <exe dir>/plugins,
// ./build/plugins, <module root>/build/plugins.
func (c *config) searchList() []searchDir {
	var out []searchDir
	for _, p := range c.paths {
		out = append(out, searchDir{p, "explicit"})
	}
	if c.env {
		for _, p := range filepath.SplitList(os.Getenv(EnvPluginPath)) {
			if p != "" {
				out = append(out, searchDir{p, EnvPluginPath})
			}
		}
	}
	if c.defaults {
		if exe, err := os.Executable(); err == nil {
			out = append(out, searchDir{filepath.Join(filepath.Dir(exe), "plugins"), "executable"})
		}
		out = append(out, searchDir{filepath.Join("build", "plugins"), "build"})
		if root := modroot.Find(); root != "" {
			out = append(out, searchDir{filepath.Join(root, "build", "plugins"), "build"})
		}
	}
	return out
}

// files expands the search list into plugin files, each once (by resolved path). A folder
// yields its libxpu-*.so files; an explicit file is taken whatever its name; a path that does
// not exist is kept when it was named explicitly (it becomes a "file missing" candidate) and
// skipped when it is one of the default folders.
func (c *config) files() []searchDir {
	seen := map[string]bool{}
	var out []searchDir
	add := func(p, source string) {
		abs, err := filepath.Abs(p)
		if err != nil {
			abs = p
		}
		if r, err := filepath.EvalSymlinks(abs); err == nil {
			abs = r
		}
		if !seen[abs] {
			seen[abs] = true
			out = append(out, searchDir{abs, source})
		}
	}
	for _, s := range c.searchList() {
		st, err := os.Stat(s.path)
		switch {
		case err != nil:
			// a missing explicit path, or a missing .so in XPU_PLUGIN_PATH, is worth reporting
			if s.source == "explicit" || (s.source == EnvPluginPath && strings.HasSuffix(s.path, ".so")) {
				add(s.path, s.source)
			}
		case st.IsDir():
			matches, _ := filepath.Glob(filepath.Join(s.path, PluginGlob))
			sort.Strings(matches)
			for _, m := range matches {
				add(m, s.source)
			}
		default:
			add(s.path, s.source)
		}
	}
	return out
}

// Discover finds every candidate plugin, probes each and marks the best usable one per
// backend name as Chosen. No plugin code runs in this process: each file is dlopened and
// probed in a short-lived child (see the package's plugin-host entry point), concurrently and
// with a deadline (WithProbeTimeout), unless the on-disk cache already has its answer (see
// EnvCacheDir, Rescan). A plugin whose probe crashes, aborts, exits or hangs, and a file that
// is no regular file (a FIFO named libxpu-x.so), is a candidate with Err set (ErrProbeFault for
// the former), never an error of Discover, which fails only when ctx is done; cancelling ctx
// kills the probe children.
func Discover(ctx context.Context, opts ...Option) ([]Candidate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := refuseInPluginHost(); err != nil {
		return nil, err
	}
	c := newConfig(opts)
	cands, err := c.probeAll(ctx, c.files())
	if err != nil {
		return nil, err
	}
	choose(cands)
	return cands, nil
}

// choose marks the highest positive score per name; earlier candidates win ties (explicit
// paths come first). The others get the reason they lost.
func choose(cands []Candidate) {
	best := map[string]int{}
	for i, cd := range cands {
		if cd.Err != nil || cd.Score <= 0 {
			continue
		}
		if j, ok := best[cd.Name]; !ok || cd.Score > cands[j].Score {
			best[cd.Name] = i
		}
	}
	for i := range cands {
		cd := &cands[i]
		if j, ok := best[cd.Name]; ok && j == i {
			cd.Chosen = true
			continue
		}
		if cd.Err == nil && cd.Score > 0 {
			w := cands[best[cd.Name]]
			cd.Reason = fmt.Sprintf("%s (score %d) is preferred to this one (score %d)", w.Path,
				w.Score, cd.Score)
		}
	}
}
