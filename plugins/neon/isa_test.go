package neon_test

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/cpu"
)

// wantInt8Path is the int8 dot-product path a neon build takes on this CPU, found here from the
// CPU's flags, independently of the plugin's own test.
func wantInt8Path(file string) string {
	vnni := cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512VL
	switch {
	case runtime.GOARCH == "arm64" && cpu.ARM64.HasASIMDDP:
		return "arm64 dotprod"
	case runtime.GOARCH == "arm64":
		return "arm64 NEON widening"
	case strings.Contains(file, "avx512") && vnni:
		return "AVX-512 VNNI"
	case strings.Contains(file, "avx512"):
		return "AVX-512 without VNNI (AVX2 int8)"
	case strings.Contains(file, "avx2") && vnni:
		return "AVX2, VNNI on 256-bit vectors"
	case strings.Contains(file, "avx2"):
		return "AVX2"
	}
	return "portable (SSE2 widening)"
}

// TestDeviceNamesInt8Path: the device's name (what `xpu devices` lists and `xpu run --stats`
// prints) says which int8 path the quantized kernels take on this CPU, so that a figure is
// never read as another instruction set's.
func TestDeviceNamesInt8Path(t *testing.T) {
	for _, f := range pluginFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			name := openUsable(t, f).Devices()[0].Info().Name
			require.Contains(t, name, "int8: "+wantInt8Path(filepath.Base(f))+")", name)
		})
	}
}
