//go:build !unix

package conformance

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

func memfdMemory(int) (int, []byte, func(), error) {
	return -1, nil, nil, fmt.Errorf("shared-memory fds exist on unix systems only: %w", core.ErrUnsupported)
}
