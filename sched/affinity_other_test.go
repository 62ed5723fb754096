//go:build !linux

package sched

import "github.com/xpuhub/xpu/core"

func threadCPUs() ([]int, error) { return nil, core.ErrUnsupported }
