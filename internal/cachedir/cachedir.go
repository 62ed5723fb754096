// Package cachedir locates xpu's cache folder, the one rule every cache (probe results, OpenCL
// programs, profiles, tuning, calibrations, draft histories, Core ML models) follows.
package cachedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Env names the variable that overrides the cache folder; the OpenCL plugin reads it too.
const Env = "XPU_CACHE_DIR"

// ErrNoCacheDir means no cache folder could be found: none of $XPU_CACHE_DIR, $XDG_CACHE_HOME
// or a home directory is set.
var ErrNoCacheDir = errors.New("no cache folder (set " + Env + ")")

// Dir is the cache folder sub (a name like "probe") under the root: $XPU_CACHE_DIR, else
// $XDG_CACHE_HOME/xpu, else ~/.cache/xpu. An empty sub gives the root.
func Dir(sub string) (string, error) {
	if d := os.Getenv(Env); d != "" {
		return filepath.Join(d, sub), nil
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "xpu", sub), nil
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", fmt.Errorf("%w: %v", ErrNoCacheDir, err)
	}
	return filepath.Join(home, ".cache", "xpu", sub), nil
}
