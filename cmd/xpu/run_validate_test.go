package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/internal/required"
	"github.com/xpuhub/xpu/loader"
)

// `xpu run --validate` checks every ABI call of a real model run, in process and isolated, and
// a correct plugin gives the same greedy text with it as without.
func TestRunValidate(t *testing.T) {
	p := storiesPath(t)
	b, err := loader.Open(context.Background(), "neon")
	if err != nil {
		required.Skip(t, "neon", "neon plugin not found (run make plugins): %v", err)
		return
	}
	require.NoError(t, b.Close())
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	for _, extra := range [][]string{nil, {"--isolated"}, {"--units", "neon{cpus=0,threads=1},neon{cpus=1,threads=1}"}} {
		t.Run(strings.Join(append([]string{"validate"}, extra...), " "), func(t *testing.T) {
			args := []string{"run", "--model", p, "--temp", "0", "-n", "32", "--validate"}
			if len(extra) == 0 || extra[0] == "--isolated" {
				args = append(args, "--backend", "neon")
			}
			code, out, errOut := runCLI(t, append(args, extra...)...)
			require.Equal(t, 0, code, errOut)
			assert.True(t, strings.HasPrefix(string(want), strings.TrimSuffix(out, "\n")), out)
			assert.NotContains(t, errOut, "validate:")
		})
	}
}
