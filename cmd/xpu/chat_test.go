package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
)

// `xpu run --chat`: two turns, /reset, and the same question after the reset gets the same
// (greedy) answer as the first time.
func TestRunChat(t *testing.T) {
	model := storiesPath(t)
	old := stdin
	stdin = strings.NewReader("Tell me about Lily.\nAnd Tom?\n/reset\nTell me about Lily.\n/exit\n")
	defer func() { stdin = old }()
	code, out, errOut := runCLI(t, "run", model, "--chat", "--temp", "0", "-n", "12", "--backend", "ref")
	require.Equal(t, 0, code, errOut)
	turns := strings.Split(out, "> ")
	require.GreaterOrEqual(t, len(turns), 6, "%q", out)
	// turns[3] is the /reset line's prompt, which has no answer
	first, second, afterReset := turns[1], turns[2], turns[4]
	assert.Empty(t, strings.TrimSpace(turns[3]))
	assert.NotEmpty(t, strings.TrimSpace(first))
	assert.NotEmpty(t, strings.TrimSpace(second))
	assert.Equal(t, first, afterReset, "after /reset the conversation starts over")
	assert.Contains(t, errOut, "no chat template")
	assert.Contains(t, errOut, "conversation reset")
	assert.Equal(t, 3, strings.Count(errOut, "chat: 12 tokens")+strings.Count(errOut, "(stop: eos)")+strings.Count(errOut, "(stop: stop-string)"))
}

// interruptingWriter sends an interrupt once the answer has begun.
type interruptingWriter struct {
	bytes.Buffer
	intr chan os.Signal
	sent bool
	seen int
}

func (w *interruptingWriter) Write(p []byte) (int, error) {
	w.seen++
	// the first write is the "> " prompt; the next ones are the answer
	if w.seen == 3 && !w.sent {
		w.sent = true
		w.intr <- os.Interrupt
	}
	return w.Buffer.Write(p)
}

// Ctrl-C during an answer stops that answer; the chat goes on with the next question.
func TestChatInterruptStopsTheAnswer(t *testing.T) {
	ctx := context.Background()
	eng, err := llm.Load(ctx, storiesPath(t), llm.WithBackend("ref"))
	require.NoError(t, err)
	defer eng.Close()
	intr := make(chan os.Signal, 1)
	out := &interruptingWriter{intr: intr}
	var errw bytes.Buffer
	code := chatLoop(ctx, eng.Runner, chatIO{in: strings.NewReader("Tell me a long story.\nHi\n"), out: out,
		errw: &errw, interrupts: intr}, "", nil, llm.WithMaxTokens(30))
	require.Equal(t, 0, code, errw.String())
	assert.Contains(t, errw.String(), "answer stopped")
	assert.Equal(t, 1, strings.Count(errw.String(), " tokens, "), "one answer completed: %s", errw.String())
	turns := strings.Split(out.String(), "> ")
	require.Len(t, turns, 4, "%q", out.String())
	assert.NotEmpty(t, strings.TrimSpace(turns[2]), "the second question was answered")
}
