package llmconform

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/conformance"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
	"github.com/xpuhub/xpu/loader"
)

// TestStoriesCases runs the stories260K cases on the NEON plugin when it is built (fast; the
// llm package's tests already run the same greedy generation on ref) and on ref otherwise.
func TestStoriesCases(t *testing.T) {
	if _, err := ModelsDir(); errors.Is(err, conformance.ErrSkip) {
		t.Skip(err)
	}
	b, err := loader.Open(context.Background(), "neon")
	if err != nil {
		t.Logf("neon plugin not built (%v): using ref", err)
		b = ref.New()
	}
	defer b.Close()
	dev := b.Devices()[0]
	res, err := greedyCase(context.Background(), dev)
	require.NoError(t, err)
	assert.Less(t, res.NMSE, 1e-6)
	res, err = quantCase(context.Background(), dev, core.Q8_0)
	require.NoError(t, err)
	t.Log(res.Detail)
	assert.Greater(t, res.NMSE, 0.0)
}

func TestSyntheticCaseOnReference(t *testing.T) {
	b := ref.New()
	defer b.Close()
	res, err := synthCase(context.Background(), b.Devices()[0])
	require.NoError(t, err)
	assert.Zero(t, res.NMSE, "ref against itself")
}

func TestModelsDirPrefersTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, storiesFile), nil, 0o600))
	t.Setenv(EnvModels, dir)
	got, err := ModelsDir()
	require.NoError(t, err)
	assert.Equal(t, dir, got)
}

func TestRegistered(t *testing.T) {
	err := conformance.RegisterModelCase(conformance.ModelCase{Name: "stories260K-greedy", Run: greedyCase})
	assert.Error(t, err, "the init registration must have taken the name")
}
