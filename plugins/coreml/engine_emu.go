//go:build !darwin

package coreml

import (
	"context"
	"fmt"
	"runtime"

	"github.com/xpuhub/xpu/plugins/coreml/emu"
)

func probe() (int, string) {
	return 0, fmt.Sprintf("Core ML exists only on Apple systems (this is %s/%s); the emulated runtime serves conformance and tests", runtime.GOOS, runtime.GOARCH)
}

func newEngine() (engine, error) { return emuEngine{}, nil }

// emuEngine runs packages with the emulated Core ML runtime: "compiling" is parsing and
// checking the package the lowering wrote.
type emuEngine struct{}

func (emuEngine) label() string  { return EmulatedLabel }
func (emuEngine) emulated() bool { return true }

func (emuEngine) load(ctx context.Context, pkgDir, cacheDir, key, units string) (model, error) {
	m, err := emu.Load(pkgDir)
	if err != nil {
		return nil, err
	}
	return emuModel{m}, nil
}

type emuModel struct{ m *emu.Model }

func (e emuModel) predict(ctx context.Context, _ []feature, in, out map[string][]byte) error {
	return e.m.Predict(ctx, in, out)
}

func (emuModel) close() error { return nil }
