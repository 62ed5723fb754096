package llm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/llm/prompt"
	"github.com/xpuhub/xpu/loader"
)

func storiesPath(t *testing.T) string { return filepath.Join(modelsDir(t), "stories260K.gguf") }

// The default policy takes the best plugin device and never the reference when a plugin is
// found; the test model's published greedy text comes out of it.
func TestLoadStoriesDefaultDevice(t *testing.T) {
	ctx := context.Background()
	want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
	require.NoError(t, err)
	cands, err := loader.Discover(ctx)
	require.NoError(t, err)
	plugins := 0
	for _, c := range cands {
		if c.Chosen && c.Score > 0 {
			plugins++
		}
	}
	eng, err := Load(ctx, storiesPath(t), WithReferenceFallback())
	require.NoError(t, err)
	defer func() { require.NoError(t, eng.Close()) }()
	if plugins > 0 {
		assert.NotEqual(t, loader.RefName, eng.Device().Info().Backend, "a plugin device exists, ref must not be chosen")
	}
	t.Logf("chosen device: %s", eng.Device().Info().ID())
	res, err := eng.Generate(ctx, "", WithMaxTokens(256))
	require.NoError(t, err)
	require.Equal(t, strings.TrimSuffix(string(want), "\n"), res.Text)
	require.NoError(t, eng.Close())
	require.NoError(t, eng.Close(), "a second Close is a no-op")
}

// Without plugins and without asking for the reference, Load refuses instead of decoding at
// float64 speed.
func TestLoadNeverRefUnlessAsked(t *testing.T) {
	ctx := context.Background()
	noPlugins := WithSource(loader.NewSource(loader.WithoutEnv(), loader.WithoutDefaultDirs()))
	_, err := Load(ctx, storiesPath(t), noPlugins)
	require.ErrorIs(t, err, ErrNoDevice)
	assert.Contains(t, err.Error(), `"ref"`)

	eng, err := Load(ctx, storiesPath(t), noPlugins, WithReferenceFallback())
	require.NoError(t, err)
	assert.Equal(t, "ref:0", eng.Device().Info().ID())
	require.NoError(t, eng.Close())
}

func TestLoadErrors(t *testing.T) {
	ctx := context.Background()
	path := storiesPath(t)
	tests := []struct {
		name string
		path string
		opts []LoadOption
		want error
	}{
		{"negative device", path, []LoadOption{WithDevice(-1)}, core.ErrInvalidArgument},
		{"device past the backend's", path, []LoadOption{WithBackend("ref"), WithDevice(3)}, core.ErrNotFound},
		{"unknown backend", path, []LoadOption{WithBackend("nosuch")}, core.ErrNotFound},
		{"nil policy", path, []LoadOption{WithPolicy(nil)}, core.ErrInvalidArgument},
		{"bad runner option", path, []LoadOption{WithBackend("ref"), WithRunnerOptions(WithChunkSize(0))}, core.ErrInvalidArgument},
		{"missing file", filepath.Join(t.TempDir(), "none.gguf"), nil, os.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eng, err := Load(ctx, tc.path, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, eng)
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

// WithLoadLogger receives the library's debug lines; nothing is logged above Debug on success.
func TestLoadLogger(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	eng, err := Load(context.Background(), storiesPath(t), WithBackend("ref"), WithLoadLogger(log))
	require.NoError(t, err)
	require.NoError(t, eng.Close())
	assert.Contains(t, buf.String(), "llm: model loaded")
	assert.NotContains(t, buf.String(), "level=INFO")
	assert.NotContains(t, buf.String(), "level=WARN")
}

func TestStopFilter(t *testing.T) {
	tests := []struct {
		name     string
		pieces   []string
		stops    []string
		streamed string
		stopped  bool
		text     string
	}{
		{"no stop", []string{"a", "b", "c"}, []string{"x"}, "abc", false, "abc"},
		{"stop inside a piece", []string{"ab", "cXYd"}, []string{"XY"}, "abc", true, "abc"},
		{"stop across pieces", []string{"ab", "X", "Yd"}, []string{"XY"}, "ab", true, "ab"},
		{"held back then released", []string{"ab", "X", "Z"}, []string{"XY"}, "abXZ", false, "abXZ"},
		{"earliest of two", []string{"a1b2"}, []string{"2", "1"}, "a", true, "a"},
		{"stop at the start", []string{"\nUser:", " hi"}, []string{"\nUser:"}, "", true, ""},
		{"multibyte", []string{"é", "ü", "!"}, []string{"ü!"}, "é", true, "é"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got strings.Builder
			f := &stopFilter{stops: tc.stops, out: func(s string) error { got.WriteString(s); return nil }}
			stopped := false
			for _, p := range tc.pieces {
				if err := f.write(p); err != nil {
					require.True(t, errors.Is(err, errStopString))
					stopped = true
					break
				}
			}
			text := f.text.String()
			if stopped {
				text = text[:f.cut]
			} else {
				require.NoError(t, f.flush())
			}
			assert.Equal(t, tc.stopped, stopped)
			assert.Equal(t, tc.streamed, got.String())
			assert.Equal(t, tc.text, text)
		})
	}
}

// GenerateUntil on the real model: the text ends before the stop string, which is the
// published greedy text's first occurrence of it.
func TestGenerateUntilStories(t *testing.T) {
	m := openStories(t)
	want, err := os.ReadFile(filepath.Join(modelsDir(t), "stories260K.greedy.txt"))
	require.NoError(t, err)
	r, err := NewRunner(context.Background(), m, refDevice(t))
	require.NoError(t, err)
	defer r.Close()
	const stop = " the"
	i := strings.Index(string(want), stop)
	require.Positive(t, i)
	var streamed strings.Builder
	res, err := r.GenerateUntil(context.Background(), "", []string{stop}, WithMaxTokens(256),
		WithStream(func(s string) error { streamed.WriteString(s); return nil }))
	require.NoError(t, err)
	assert.Equal(t, StopString, res.Stop)
	assert.Equal(t, string(want[:i]), res.Text)
	assert.Equal(t, res.Text, streamed.String())
}

// A second turn that reuses the KV cache produces what a fresh prefill of the whole
// conversation produces.
func TestChatKeepsCache(t *testing.T) {
	ctx := context.Background()
	eng, err := Load(ctx, storiesPath(t), WithBackend("ref"))
	require.NoError(t, err)
	defer eng.Close()
	chat, err := eng.NewChat(WithSystemPrompt("Once upon a time"))
	require.NoError(t, err)
	assert.True(t, chat.Template().IsFallback(), "stories260K has no chat template")
	first, err := chat.Send(ctx, "Tell me about Lily.", WithMaxTokens(6))
	require.NoError(t, err)
	assert.Zero(t, first.CachedTokens)
	before := eng.Len()
	second, err := chat.Send(ctx, "And Tom?", WithMaxTokens(6))
	require.NoError(t, err)
	assert.Positive(t, second.CachedTokens, "the second turn reused the first's cache")
	msgs := chat.Messages()
	require.Len(t, msgs, 5)
	assert.Equal(t, prompt.Message{Role: "user", Content: "And Tom?"}, msgs[3])

	// The same conversation prefilled from scratch on a second runner.
	r2, err := eng.NewRunner(ctx)
	require.NoError(t, err)
	defer r2.Close()
	fresh, err := NewChat(r2)
	require.NoError(t, err)
	again, err := fresh.Complete(ctx, msgs[:4], WithMaxTokens(6))
	require.NoError(t, err)
	assert.Equal(t, again.Text, second.Text)
	assert.Greater(t, again.PromptTokens, second.PromptTokens, "the second turn fed only the new text (cache held %d tokens)", before)

	chat.Reset()
	assert.Len(t, chat.Messages(), 1, "the system prompt survives Reset")
	assert.Zero(t, eng.Len())
}

func TestChatTemplateErrors(t *testing.T) {
	m := openStories(t)
	_, err := prompt.New(m.Tokenizer, "{% for %}")
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	ct, err := prompt.New(m.Tokenizer, "{{ raise_exception('no system role') }}")
	require.NoError(t, err)
	_, err = ct.Render([]prompt.Message{{Role: "system", Content: "x"}}, true)
	require.ErrorIs(t, err, core.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "no system role")
}
