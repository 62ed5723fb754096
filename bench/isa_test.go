package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLibIsaPathAsNeonSaysIt: isa_path takes the neon plugin's own words (its device name says
// its build and the int8 path the kernels take), and falls back to the CPU's flags without xpu.
func TestLibIsaPathAsNeonSaysIt(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "xpu")
	devices := `#!/usr/bin/env bash
[[ "$1" == devices ]] || exit 1
echo "BACKEND  DEVICE  UNIT  KIND  SCORE  CAPABILITIES / REASON  PATH"
echo "ref      0: Go float64 reference  ref:0  cpu  1  import-host  (built in)"
echo "neon     0: NEON via SIMDe on x86-64 (AVX2/FMA build, int8: AVX2, VNNI on 256-bit vectors), 2 cores  neon:0  cpu  30  async  /x/libxpu-neon-avx2.so"
`
	require.NoError(t, os.WriteFile(fake, []byte(devices), 0o755))
	tests := []struct {
		name, xpu string
		want      []string
	}{
		{"from the plugin", fake, []string{"neon AVX2/FMA build, int8: AVX2, VNNI on 256-bit vectors\n"}},
		{"from the CPU flags", "/nonexistent/xpu", []string{"avx512\n", "avx2\n", "portable\n", "arm64 neon\n", "arm64 neon+dotprod\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Contains(t, tc.want, libSh(t, []string{"XPU=" + tc.xpu}, "isa_path"))
		})
	}
}
