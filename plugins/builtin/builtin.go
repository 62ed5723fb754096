// Package builtin links the backends compiled into a binary (the reference, core/ref, and Core
// ML, plugins/coreml) so that they register themselves (core.Register): a program imports it
// for its side effect, as a database/sql program imports its drivers.
package builtin

import (
	// the float64 reference backend, "ref"
	_ "github.com/xpuhub/xpu/core/ref"
	// Core ML (the emulated runtime off Apple systems), "coreml"
	_ "github.com/xpuhub/xpu/plugins/coreml"
)
