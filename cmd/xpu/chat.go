package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/xpuhub/xpu/llm"
)

// chatIO is where the chat reads and writes, and the interrupts (Ctrl-C) it listens to.
type chatIO struct {
	in         io.Reader
	out, errw  io.Writer
	interrupts <-chan os.Signal
}

// interrupts delivers Ctrl-C to the chat. The program's own context is cancelled by the first
// one too; the chat's turns do not derive from it, so that Ctrl-C ends an answer, not the
// conversation.
func interrupts() (ch <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	return c, func() { signal.Stop(c) }
}

// chatLoop is `xpu run --chat`: one user line per turn, the answer streamed, the KV cache kept
// between turns (llm.Chat). /reset forgets the conversation, /exit or end of input ends it.
// Ctrl-C during an answer stops that answer; at the prompt it ends the chat.
func chatLoop(ctx context.Context, r *llm.Runner, cio chatIO, system string, stops []string, opts ...llm.GenerateOption) int {
	var copts []llm.ChatOption
	if system != "" {
		copts = append(copts, llm.WithSystemPrompt(system))
	}
	copts = append(copts, llm.WithChatStops(stops...))
	chat, err := llm.NewChat(r, copts...)
	if err != nil {
		fmt.Fprintf(cio.errw, "xpu run: %v\n", err)
		return 1
	}
	if chat.Template().IsFallback() {
		fmt.Fprintln(cio.errw, "chat: the model has no chat template; using a plain User:/Assistant: transcript")
	}
	fmt.Fprintln(cio.errw, "chat: /reset forgets the conversation, /exit (or end of input) ends it, Ctrl-C stops an answer")
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(cio.in)
		sc.Buffer(make([]byte, 64<<10), maxPromptBytes)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	base := context.WithoutCancel(ctx)
	for {
		fmt.Fprint(cio.out, "> ")
		var line string
		select {
		case l, ok := <-lines:
			if !ok {
				fmt.Fprintln(cio.out)
				return 0
			}
			line = l
		case <-cio.interrupts:
			fmt.Fprintln(cio.out)
			return 0
		}
		switch strings.TrimSpace(line) {
		case "":
			continue
		case "/exit", "/quit":
			return 0
		case "/reset":
			chat.Reset()
			fmt.Fprintln(cio.errw, "chat: conversation reset")
			continue
		}
		turn, cancel := context.WithCancel(base)
		stopped := make(chan struct{})
		go func() {
			select {
			case <-cio.interrupts:
				cancel()
			case <-stopped:
			}
		}()
		res, err := chat.Send(turn, line, append(opts, llm.WithStream(func(text string) error {
			_, err := fmt.Fprint(cio.out, text)
			return err
		}))...)
		close(stopped)
		interrupted := turn.Err() != nil
		cancel()
		fmt.Fprintln(cio.out)
		switch {
		case interrupted && errors.Is(err, context.Canceled):
			fmt.Fprintln(cio.errw, "chat: answer stopped (the question is dropped from the conversation)")
		case err != nil:
			fmt.Fprintf(cio.errw, "xpu run: %v\n", err)
			return 1
		default:
			fmt.Fprintf(cio.errw, "chat: %d tokens, %.1f tok/s (stop: %s)\n", len(res.Tokens),
				res.DecodeTokensPerSecond(), res.Stop)
		}
	}
}
