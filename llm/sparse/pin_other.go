//go:build !unix

package sparse

import (
	"fmt"

	"github.com/xpuhub/xpu/core"
)

func pinPages([]byte) error { return fmt.Errorf("sparse: pinning pages: %w", core.ErrUnsupported) }

func unpinPages([]byte) error { return nil }
