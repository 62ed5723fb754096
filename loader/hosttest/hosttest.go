// Package hosttest is the TestMain of test binaries that open isolated plugins: the loader
// starts os.Executable() as the plugin host, as it starts the xpu binary in production, so the
// test binary must serve that role before it runs any test.
package hosttest

import (
	"os"
	"testing"

	"github.com/xpuhub/xpu/loader"
	"github.com/xpuhub/xpu/loader/plugintest"
)

// Main serves and exits when the loader started this binary as a plugin host; otherwise it
// runs the tests, removes the test plugins plugintest built and exits with the tests' status.
// Call it as the whole body of TestMain.
func Main(m *testing.M) {
	loader.ServeIfPluginHost()
	code := m.Run()
	plugintest.Cleanup()
	os.Exit(code)
}
