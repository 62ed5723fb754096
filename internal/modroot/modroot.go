// Package modroot finds the module root, the folder holding go.mod, for the loader's build
// folder search and for the tests that build plugins from the source tree.
package modroot

import (
	"os"
	"path/filepath"
)

// Find walks up from the working directory to the folder holding go.mod; "" when there is none.
func Find() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
