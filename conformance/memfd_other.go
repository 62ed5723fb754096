//go:build !linux

package conformance

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

func memfdMemory(int) (int, []byte, func(), error) {
	return -1, nil, nil, fmt.Errorf("memfd exists on linux only: %w", core.ErrUnsupported)
}
