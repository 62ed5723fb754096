package llm

import (
	"testing"

	"github.com/xpuhub/xpu/loader/hosttest"
)

// TestMain lets this test binary serve isolated plugins (see hosttest).
func TestMain(m *testing.M) { hosttest.Main(m) }
