package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ollama npm client speaks to `xpu serve` as to ollama: version, list, generate, chat
// streamed and not, show, and an unknown model's error.
func TestServeOllamaClient(t *testing.T) {
	model := storiesPath(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the ollama client test needs it (scripts/deps.sh installs it)")
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules", "ollama")); err != nil {
		t.Skipf("the ollama npm package is not in %s: run scripts/deps.sh", npmDir)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "ollama_client.mjs"))
	require.NoError(t, err)
	scriptPath := filepath.Join(npmDir, fmt.Sprintf("ollama_client_%d.mjs", os.Getpid()))
	require.NoError(t, os.WriteFile(scriptPath, script, 0o644))
	defer os.Remove(scriptPath)

	p := startServe(t, model, "--ctx", "256", "--max-tokens", "64")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, scriptPath, p.url, "stories260K").Output()
	var ee *exec.ExitError
	if err != nil && errors.As(err, &ee) {
		t.Fatalf("node client failed: %v\n%s\nserver:\n%s", err, ee.Stderr, p.stderr)
	}
	require.NoError(t, err)
	var got struct {
		Version  string
		Models   []string
		Generate struct {
			Text, Reason string
			Done         bool
			EvalCount    int
		}
		ChatStream struct {
			Text             string
			Parts, EvalCount int
			Done             bool
		}
		Chat         struct{ Text, Role string }
		Show         struct{ Family string }
		UnknownModel string
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.NotEmpty(t, got.Version)
	assert.Equal(t, []string{"stories260K:latest"}, got.Models)
	assert.NotEmpty(t, got.Generate.Text)
	assert.True(t, got.Generate.Done)
	assert.Equal(t, 12, got.Generate.EvalCount)
	assert.Equal(t, "length", got.Generate.Reason)
	assert.NotEmpty(t, got.ChatStream.Text)
	assert.Greater(t, got.ChatStream.Parts, 2)
	assert.True(t, got.ChatStream.Done)
	assert.Equal(t, got.Chat.Text, got.ChatStream.Text, "greedy: the stream adds up to the whole answer")
	assert.Equal(t, "assistant", got.Chat.Role)
	assert.Equal(t, "llama", got.Show.Family)
	assert.Contains(t, got.UnknownModel, "not found")
}
