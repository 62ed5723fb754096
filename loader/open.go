package loader

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// RefName is the name of the built-in reference backend.
const RefName = ref.Name

// isPath tells a plugin file from a backend name.
func isPath(s string) bool { return strings.ContainsRune(s, '/') || strings.HasSuffix(s, ".so") }

// Open opens one backend: a built-in one by name (core.Register: "ref", the reference, and the
// backends the binary links in, such as Core ML), a backend name ("neon", "opencl": the best
// candidate discovery finds) or a plugin file path.
func Open(ctx context.Context, nameOrPath string, opts ...Option) (core.Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b, ok := core.Lookup(nameOrPath); ok {
		return b.Open(ctx)
	}
	if err := refuseInPluginHost(); err != nil {
		return nil, err
	}
	c := newConfig(opts)
	if isPath(nameOrPath) {
		abs, err := filepath.Abs(nameOrPath)
		if err != nil {
			return nil, fmt.Errorf("plugin %s: %w", nameOrPath, err)
		}
		cd, err := c.probeCandidate(ctx, searchDir{abs, "explicit"})
		if err != nil {
			return nil, err
		}
		if cd.Err != nil {
			return nil, cd.Err
		}
		return openCandidate(ctx, c, cd)
	}
	cands, err := Discover(ctx, opts...)
	if err != nil {
		return nil, err
	}
	var why []string
	for _, cd := range cands {
		if cd.Name != nameOrPath {
			continue
		}
		if cd.Chosen {
			return openCandidate(ctx, c, cd)
		}
		why = append(why, fmt.Sprintf("%s: %s", cd.Path, cd.Reason))
	}
	if len(why) == 0 {
		return nil, fmt.Errorf("backend %q: no plugin found (searched %s): %w", nameOrPath,
			c.describeSearch(), core.ErrNotFound)
	}
	return nil, fmt.Errorf("backend %q: no usable plugin: %s: %w", nameOrPath,
		strings.Join(why, "; "), core.ErrNotFound)
}

func (c *config) describeSearch() string {
	var parts []string
	for _, s := range c.searchList() {
		parts = append(parts, s.path)
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// openCandidate opens a probed candidate in this process or isolated.
func openCandidate(ctx context.Context, c *config, cd Candidate) (core.Backend, error) {
	if cd.Score <= 0 {
		return nil, fmt.Errorf("plugin %s (%s) cannot run here: %s: %w", cd.Path, cd.Name,
			cd.Reason, core.ErrUnsupported)
	}
	var b core.Backend
	if c.isolate(cd.Name) {
		var err error
		if b, err = openIsolated(ctx, c, cd); err != nil {
			return nil, err
		}
	} else {
		p, err := abi.Open(cd.Path)
		if err != nil {
			return nil, err
		}
		var bopts []abi.BackendOption
		if c.validate {
			bopts = append(bopts, abi.WithValidation())
		}
		if b, err = abi.NewBackend(p, bopts...); err != nil {
			p.Close()
			return nil, err
		}
	}
	// a backend without a device would otherwise vanish from every listing without a word
	if len(b.Devices()) == 0 {
		b.Close()
		return nil, zeroDevices(cd.Path, cd.Name)
	}
	return b, nil
}

// OpenAll opens every chosen candidate with a score above 0. A candidate that fails to open
// keeps the error in its Err and Reason (and is logged); the others are still returned. The
// error is non-nil only when ctx is done.
func OpenAll(ctx context.Context, opts ...Option) ([]core.Backend, []Candidate, error) {
	cands, err := Discover(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	c := newConfig(opts)
	var out []core.Backend
	for i := range cands {
		cd := &cands[i]
		if !cd.Chosen || cd.Score <= 0 {
			continue
		}
		b, err := openCandidate(ctx, c, *cd)
		if err != nil {
			if ctx.Err() != nil {
				closeAll(c, out)
				return nil, cands, ctx.Err()
			}
			logOrDefault(c.logger).Warn("loader: plugin failed to open", "path", cd.Path, "err", err)
			cd.Err, cd.Reason, cd.Chosen = err, err.Error(), false
			continue
		}
		out = append(out, b)
	}
	return out, cands, nil
}

func closeAll(c *config, bs []core.Backend) {
	var errs []error
	for _, b := range bs {
		errs = append(errs, b.Close())
	}
	if err := errors.Join(errs...); err != nil {
		logOrDefault(c.logger).Warn("loader: close", "err", err)
	}
}
