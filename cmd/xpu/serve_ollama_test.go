package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ollama npm client speaks to `xpu serve` as to ollama: version, list, generate, chat
// streamed and not, show, and an unknown model's error.
func TestServeOllamaClient(t *testing.T) {
	model := storiesPath(t)
	client := nodeClient(t, "ollama", "ollama_client.mjs")
	p := startServe(t, model, "--ctx", "256", "--max-tokens", "64")
	out := client(p, p.url, "stories260K")
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
