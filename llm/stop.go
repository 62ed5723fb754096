package llm

import (
	"context"
	"errors"
	"strings"
)

// StopString: generation ended at one of the stop strings given to GenerateUntil.
const StopString StopReason = "stop-string"

// errStopString ends Generate from its stream callback once a stop string appears.
var errStopString = errors.New("llm: stop string reached")

// GenerateUntil is Runner.Generate that also ends when the text contains one of stops (empty
// strings are ignored). The stop string and what follows it are neither streamed nor in
// Result.Text (Result.Tokens still holds every token sampled, up to the one that completed
// it), and Result.Stop is StopString. Text that could be the beginning of a stop string is held
// back from the stream until it is known not to be.
func (r *Runner) GenerateUntil(ctx context.Context, prompt string, stops []string, opts ...GenerateOption) (Result, error) {
	stops = nonEmpty(stops)
	if len(stops) == 0 {
		return r.Generate(ctx, prompt, opts...)
	}
	var cfg genConfig
	for _, o := range opts {
		o(&cfg)
	}
	f := &stopFilter{stops: stops, out: cfg.stream}
	res, err := r.Generate(ctx, prompt, append(opts, WithStream(f.write))...)
	if errors.Is(err, errStopString) {
		res.Text, res.Stop = f.text.String()[:f.cut], StopString
		return res, nil
	}
	if err != nil {
		return res, err
	}
	return res, f.flush()
}

func nonEmpty(ss []string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// stopFilter watches streamed text for stop strings, forwarding what cannot be part of one.
type stopFilter struct {
	stops []string
	out   func(string) error
	text  strings.Builder
	sent  int // bytes of text forwarded
	cut   int // where the stop string begins, once found
}

func (f *stopFilter) write(piece string) error {
	f.text.WriteString(piece)
	all := f.text.String()
	longest := 0
	for _, s := range f.stops {
		longest = max(longest, len(s))
	}
	// A stop string found now must end in the new piece, so it starts at most longest-1
	// bytes before it: search from there, not from the start.
	from := max(0, len(all)-len(piece)-longest+1)
	best := -1
	for _, s := range f.stops {
		if i := strings.Index(all[from:], s); i >= 0 && (best < 0 || from+i < best) {
			best = from + i
		}
	}
	if best >= 0 {
		f.cut = best
		if err := f.forward(all[:max(best, f.sent)]); err != nil {
			return err
		}
		return errStopString
	}
	return f.forward(all[:len(all)-heldBack(all, f.stops)])
}

// forward streams text[f.sent:].
func (f *stopFilter) forward(upTo string) error {
	if len(upTo) <= f.sent {
		return nil
	}
	chunk := upTo[f.sent:]
	f.sent = len(upTo)
	if f.out == nil {
		return nil
	}
	return f.out(chunk)
}

// flush streams the text held back when generation ended without a stop string.
func (f *stopFilter) flush() error { return f.forward(f.text.String()) }

// heldBack is the length of the longest suffix of s that is a proper prefix of a stop string.
func heldBack(s string, stops []string) int {
	n := 0
	for _, st := range stops {
		for k := min(len(st)-1, len(s)); k > n; k-- {
			if strings.HasSuffix(s, st[:k]) {
				n = k
				break
			}
		}
	}
	return n
}
