package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/llm"
	"github.com/xpuhub/xpu/llm/prompt"
)

func TestServeFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"serve"}, "no model"},
		{[]string{"serve", "a.gguf", "b.gguf"}, "one model, got 2 arguments"},
		{[]string{"serve", "--model", "a.gguf", "b.gguf"}, "given twice"},
		{[]string{"serve", "-m", "a.gguf", "--backend", "neon", "--policy", "max-performance"}, "give one"},
		{[]string{"serve", "a.gguf", "--port", "70000"}, "--port 70000"},
		{[]string{"serve", "a.gguf", "-t", "-1"}, "--threads -1"},
		{[]string{"serve", "a.gguf", "--chunk", "0"}, "--chunk 0"},
		{[]string{"serve", "a.gguf", "--parallel", "0"}, "--parallel 0"},
		{[]string{"serve", "a.gguf", "--max-tokens", "0"}, "--max-tokens 0"},
		{[]string{"serve", "a.gguf", "--timeout", "-1s"}, "--timeout -1s"},
		{[]string{"serve", "a.gguf", "--chat-template", "/nonexistent/t.jinja"}, "--chat-template"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, errOut)
		first, _, _ := strings.Cut(errOut, "\n")
		assert.Contains(t, first, tc.says, "%v: the first line says what is wrong", tc.args)
		assert.Contains(t, errOut, "usage: xpu serve", "%v", tc.args)
	}
	code, _, errOut := runCLI(t, "serve", filepath.Join(t.TempDir(), "missing.gguf"), "--port", "0")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "missing.gguf")
}

// servedProcess is `xpu serve` running in its own process.
type servedProcess struct {
	cmd    *exec.Cmd
	url    string
	stderr *lockedBuffer
	exited chan error
}

// lockedBuffer collects the server's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var built struct {
	once sync.Once
	bin  string
	err  error
}

// buildXPU builds the CLI once per test run, into build/test (next to the plugins it finds).
func buildXPU(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.bin, built.err = filepath.Abs(filepath.Join("..", "..", "build", "test", "xpu"))
		if built.err != nil {
			return
		}
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		out, err := exec.Command(goTool, "build", "-o", built.bin, ".").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, built.err)
	return built.bin
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startServe runs `xpu serve` on a free port and waits for it to listen.
// nodeClient readies testdata/script, a client of the npm package pkg (installed into build/npm
// by scripts/deps.sh), skipping the test without node or the package. The script is copied into
// build/npm, since node resolves a package from the script's folder upwards, and removed when t
// ends. The returned function runs it with args against the server p and gives its stdout,
// failing the test with the script's stderr and the server's log when it fails.
func nodeClient(t *testing.T, pkg, script string) func(p *servedProcess, args ...string) []byte {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not installed: the %s client test needs it (scripts/deps.sh installs it)", pkg)
	}
	npmDir, err := filepath.Abs(filepath.Join("..", "..", "build", "npm"))
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(npmDir, "node_modules", pkg)); err != nil {
		t.Skipf("the %s npm package is not in %s: run scripts/deps.sh", pkg, npmDir)
	}
	src, err := os.ReadFile(filepath.Join("testdata", script))
	require.NoError(t, err)
	path := filepath.Join(npmDir, fmt.Sprintf("%d_%s", os.Getpid(), script))
	require.NoError(t, os.WriteFile(path, src, 0o644))
	t.Cleanup(func() { _ = os.Remove(path) })
	return func(p *servedProcess, args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, node, append([]string{path}, args...)...).Output()
		var ee *exec.ExitError
		if err != nil && errors.As(err, &ee) {
			t.Fatalf("node client failed: %v\n%s\nserver:\n%s", err, ee.Stderr, p.stderr)
		}
		require.NoError(t, err)
		return out
	}
}

func startServe(t *testing.T, args ...string) *servedProcess {
	t.Helper()
	return startServeIn(t, "", append([]string{"--port", "0"}, args...)...)
}

// startServeIn runs `xpu serve args` in dir and waits for it to listen.
func startServeIn(t *testing.T, dir string, args ...string) *servedProcess {
	t.Helper()
	bin := buildXPU(t)
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	cmd.Dir = dir
	pipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &servedProcess{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan error, 1)}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteString(line + "\n")
			if m := listening.FindStringSubmatch(line); m != nil {
				urlc <- m[1]
			}
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	select {
	case p.url = <-urlc:
	case err := <-p.exited:
		t.Fatalf("xpu serve exited before listening: %v\n%s", err, p.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("xpu serve did not listen within 60 s:\n%s", p.stderr)
	}
	return p
}

// The README's serve command, checked end to end by a real OpenAI client library (the
// `openai` npm package, installed by scripts/deps.sh into build/npm) over loopback.
func TestServeOpenAIClient(t *testing.T) {
	model := storiesPath(t)
	client := nodeClient(t, "openai", "openai_client.mjs")
	p := startServe(t, model, "--ctx", "256", "--max-tokens", "64")
	out := client(p, p.url+"/v1", "stories260K")
	var got struct {
		Models []string
		Stream struct {
			Text, Finish string
			Chunks       int
		}
		Chat struct {
			Text, Finish string
			Usage        struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		Completion                  struct{ Text, Finish string }
		UnknownModel, TooManyTokens struct {
			Status        int
			Type, Message string
		}
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	assert.Equal(t, []string{"stories260K"}, got.Models)
	assert.NotEmpty(t, got.Stream.Text)
	assert.Greater(t, got.Stream.Chunks, 2)
	assert.Equal(t, got.Chat.Text, got.Stream.Text, "greedy: the stream adds up to the whole answer")
	assert.Equal(t, got.Chat.Finish, got.Stream.Finish)
	assert.Positive(t, got.Chat.Usage.PromptTokens)
	assert.Positive(t, got.Chat.Usage.CompletionTokens)
	assert.NotEmpty(t, got.Completion.Text)
	assert.Equal(t, "length", got.Completion.Finish)
	assert.Equal(t, 404, got.UnknownModel.Status)
	assert.Equal(t, "invalid_request_error", got.UnknownModel.Type)
	assert.Equal(t, 400, got.TooManyTokens.Status)
	assert.Contains(t, got.TooManyTokens.Message, "max_tokens")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-p.exited)
}

// SIGTERM during a stream: the stream runs to its [DONE], then the server exits 0.
func TestServeSIGTERMDuringStream(t *testing.T) {
	// ref, the slowest backend, keeps the stream going while the signal lands.
	p := startServe(t, storiesPath(t), "--ctx", "320", "--backend", "ref")
	body := `{"model":"stories260K","stream":true,"temperature":0,"max_tokens":250,"messages":[{"role":"user","content":"Tell me a long story."}]}`
	resp, err := http.Post(p.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n') // the first event: the stream is under way
	require.NoError(t, err)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the stream ends cleanly, not cut")
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "stream tail: %q", tail(string(rest), 200))
	assert.Contains(t, string(rest), `"finish_reason":"length"`, "the stream ran to its token budget")
	assert.Greater(t, strings.Count(string(rest), "data: "), 50, "most of the stream came after the signal")
	select {
	case err := <-p.exited:
		require.NoError(t, err, "exit status:\n%s", p.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("xpu serve did not exit after SIGTERM:\n%s", p.stderr)
	}
	assert.Contains(t, p.stderr.String(), "shutting down")
	assert.Contains(t, p.stderr.String(), "xpu serve: stopped")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// --chat-template replaces the model's template: the prompt the server counts is the one that
// template renders.
func TestServeChatTemplateFile(t *testing.T) {
	model := storiesPath(t)
	const src = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
	file := filepath.Join(t.TempDir(), "t.jinja")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	m, err := llm.Open(model)
	require.NoError(t, err)
	defer m.Close()
	ct, err := prompt.New(m.Tokenizer, src)
	require.NoError(t, err)
	msgs := []prompt.Message{{Role: "user", Content: "Tell me a story about a red ball."}}
	_, ids, err := ct.Prompt(m.Tokenizer, msgs)
	require.NoError(t, err)
	fallback, err := m.ChatTemplate()
	require.NoError(t, err)
	_, fids, err := fallback.Prompt(m.Tokenizer, msgs)
	require.NoError(t, err)
	require.NotEqual(t, len(fids), len(ids), "the two templates must tell apart by length")

	p := startServe(t, model, "--chat-template", file, "--backend", "ref")
	body := `{"model":"stories260K","max_tokens":4,"messages":[{"role":"user","content":"Tell me a story about a red ball."}]}`
	resp, err := http.Post(p.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	assert.Equal(t, len(ids), got.Usage.PromptTokens)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-p.exited)
}
