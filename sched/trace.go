package sched

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/internal/safefile"
)

// Trace collects Chrome trace-event JSON (the "JSON Object Format" that Perfetto and
// chrome://tracing open): one track per unit (or any name the caller picks), complete slices for
// work, waits and copies, instants for points in time. It is safe for concurrent use; a nil
// *Trace records nothing, so callers trace unconditionally and pass nil to turn it off.
type Trace struct {
	start time.Time

	mu     sync.Mutex
	tracks map[string]int // track name → tid, assigned in order of first use
	names  []string       // tid-1 → track name
	events []traceEvent
}

// traceEvent is one recorded event; times stay in nanoseconds until written so nothing is
// rounded twice.
type traceEvent struct {
	ph      byte // 'X' or 'i'
	tid     int
	name    string
	ts, dur time.Duration
	args    map[string]any
}

// tracePID is the one process every track belongs to; Perfetto groups tracks by pid.
const tracePID = 1

// NewTrace starts an empty trace; event times are measured from now.
func NewTrace() *Trace {
	return &Trace{start: time.Now(), tracks: map[string]int{}}
}

// Slice records a complete event ("ph":"X") named name on track, from start to end, with args
// shown in the viewer's details pane (copied, so the caller may reuse the map). Times before the
// trace's start are clamped to it and an end before start gives a zero-length slice, so a slice
// is never drawn outside the trace.
func (t *Trace) Slice(track, name string, start, end time.Time, args map[string]any) {
	if t == nil {
		return
	}
	ts, te := t.offset(start), t.offset(end)
	t.add(traceEvent{ph: 'X', name: name, ts: ts, dur: max(te-ts, 0), args: maps.Clone(args)}, track)
}

// Instant records an instant event ("ph":"i", thread scope) on track.
func (t *Trace) Instant(track, name string, at time.Time, args map[string]any) {
	if t == nil {
		return
	}
	t.add(traceEvent{ph: 'i', name: name, ts: t.offset(at), args: maps.Clone(args)}, track)
}

// Len is the number of events recorded (metadata naming the tracks not counted).
func (t *Trace) Len() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.events)
}

func (t *Trace) offset(at time.Time) time.Duration { return max(at.Sub(t.start), 0) }

func (t *Trace) add(ev traceEvent, track string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tid, ok := t.tracks[track]
	if !ok {
		t.names = append(t.names, track)
		tid = len(t.names) // tid 0 is avoided: some viewers treat it as "no thread"
		t.tracks[track] = tid
	}
	ev.tid = tid
	t.events = append(t.events, ev)
}

// jsonEvent is the wire form of one trace event.
type jsonEvent struct {
	Name string          `json:"name"`
	Ph   string          `json:"ph"`
	Ts   float64         `json:"ts"`
	Dur  *float64        `json:"dur,omitempty"`
	Pid  int             `json:"pid"`
	Tid  int             `json:"tid"`
	S    string          `json:"s,omitempty"`
	Args json.RawMessage `json:"args,omitempty"`
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// WriteJSON writes the trace as {"traceEvents":[...],"displayTimeUnit":"ns"}: first a
// process_name and, per track, thread_name and thread_sort_index metadata (so tracks appear in
// order of first use), then the events in the order they were recorded. Args that JSON cannot
// encode (a channel, NaN) are replaced by {"error": why} on that event alone, so one bad value
// never loses the trace.
func (t *Trace) WriteJSON(w io.Writer) error {
	if t == nil {
		return fmt.Errorf("trace: write a nil trace: %w", core.ErrInvalidArgument)
	}
	t.mu.Lock()
	names := append([]string(nil), t.names...)
	events := append([]traceEvent(nil), t.events...)
	t.mu.Unlock()

	bw := bufio.NewWriter(w)
	first := true
	emit := func(e jsonEvent) error {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		sep := ",\n"
		if first {
			sep, first = "\n", false
		}
		_, _ = bw.WriteString(sep)
		_, err = bw.Write(b)
		return err
	}
	meta := func(name string, tid int, args map[string]any) error {
		raw, _ := json.Marshal(args) // strings and ints only: cannot fail
		return emit(jsonEvent{Name: name, Ph: "M", Pid: tracePID, Tid: tid, Args: raw})
	}
	_, _ = bw.WriteString(`{"traceEvents":[`)
	if err := meta("process_name", 0, map[string]any{"name": "xpu"}); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	for i, n := range names {
		tid := i + 1
		if err := meta("thread_name", tid, map[string]any{"name": n}); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		if err := meta("thread_sort_index", tid, map[string]any{"sort_index": tid}); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
	}
	for _, ev := range events {
		je := jsonEvent{Name: ev.name, Ph: string(ev.ph), Ts: micros(ev.ts), Pid: tracePID, Tid: ev.tid}
		if ev.ph == 'X' {
			d := micros(ev.dur)
			je.Dur = &d
		} else {
			je.S = "t"
		}
		if len(ev.args) > 0 {
			raw, err := json.Marshal(ev.args)
			if err != nil {
				raw, _ = json.Marshal(map[string]string{"error": "args not encodable: " + err.Error()})
			}
			je.Args = raw
		}
		if err := emit(je); err != nil {
			return fmt.Errorf("trace: event %q: %w", ev.name, err)
		}
	}
	_, _ = bw.WriteString("\n],\"displayTimeUnit\":\"ns\"}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	return nil
}

// WriteFile writes the trace to path atomically: into a temporary file in the same directory,
// then renamed over path, so a reader never sees half a trace and a failed write leaves an
// existing file as it was.
func (t *Trace) WriteFile(path string) (err error) {
	if t == nil {
		return fmt.Errorf("trace: write a nil trace: %w", core.ErrInvalidArgument)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := t.WriteJSON(f); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

// TraceEvent is one event of a trace file as WriteJSON writes it; Track is the name of its
// track (from the thread_name metadata), "" for metadata events themselves.
type TraceEvent struct {
	Name, Ph, Track string
	Ts, Dur         float64 // µs
	Args            map[string]any
}

// ReadTraceFile reads a trace written by WriteFile (or any Chrome trace-event JSON object) and
// returns its events with their track names: what a test or a tool needs to check a schedule.
func ReadTraceFile(path string) ([]TraceEvent, error) {
	data, err := safefile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("trace %s: %w: %w", path, err, core.ErrInvalidArgument)
	}
	tracks := map[int]string{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "M" && e.Name == "thread_name" {
			tracks[e.Tid], _ = e.Args["name"].(string)
		}
	}
	out := make([]TraceEvent, 0, len(doc.TraceEvents))
	for _, e := range doc.TraceEvents {
		ev := TraceEvent{Name: e.Name, Ph: e.Ph, Ts: e.Ts, Dur: e.Dur, Args: e.Args}
		if e.Ph != "M" {
			ev.Track = tracks[e.Tid]
		}
		out = append(out, ev)
	}
	return out, nil
}
