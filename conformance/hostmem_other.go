//go:build !unix

package conformance

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

func hostMemory(int) ([]byte, func(), error) {
	return nil, nil, fmt.Errorf("anonymous mappings on this OS: %w", core.ErrUnsupported)
}
