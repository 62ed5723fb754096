package llm

import (
	"fmt"
	"os"
	"testing"

	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// TestMain lets this test binary serve isolated plugins: the loader starts os.Executable()
// with "plugin-host <plugin>", as it starts the xpu binary in production.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "plugin-host" {
		if err := loader.ServePluginHost(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "plugin-host:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	plugintest.Cleanup()
	os.Exit(code)
}
