package serve

import (
	"testing"

	"github.com/xpuhub/xpu/loader/hosttest"
)

// TestMain lets this test binary serve isolated plugins (see hosttest): the crash tests open
// the neon plugin in a child process and kill it.
func TestMain(m *testing.M) { hosttest.Main(m) }
