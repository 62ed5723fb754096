package abi

import (
	"os"
	"testing"

	"github.com/xpuhub/xpu/loader/plugintest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	plugintest.Cleanup()
	os.Exit(code)
}
