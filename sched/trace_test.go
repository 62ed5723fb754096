package sched

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xpuhub/xpu/core"
)

// parsedTrace is the JSON a viewer reads.
type parsedTrace struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  *float64       `json:"dur"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		S    string         `json:"s"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
	DisplayTimeUnit string `json:"displayTimeUnit"`
}

func parseTrace(t *testing.T, tr *Trace) parsedTrace {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, tr.WriteJSON(&buf))
	var p parsedTrace
	require.NoError(t, json.Unmarshal(buf.Bytes(), &p), "the trace is valid JSON:\n%s", buf.String())
	return p
}

func TestTraceEvents(t *testing.T) {
	tr := NewTrace()
	t0 := tr.start
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	tr.Slice("neon:0{cpus=1}", "layer 0", at(10), at(35), map[string]any{"chunk": 0, "layer": 0})
	tr.Slice("opencl:0", "copy", at(20), at(21), nil)
	tr.Instant("neon:0{cpus=1}", "publish", at(35), map[string]any{"seq": 7})
	tr.Slice("opencl:0", "before start", t0.Add(-time.Second), at(5), nil) // clamped to the start
	tr.Slice("opencl:0", "backwards", at(50), at(40), nil)                 // zero length
	assert.Equal(t, 5, tr.Len())

	p := parseTrace(t, tr)
	assert.Equal(t, "ns", p.DisplayTimeUnit)
	threadNames := map[int]string{}
	type ev struct {
		ph, track string
		ts, dur   float64
	}
	var got []ev
	var byName = map[string]map[string]any{}
	for _, e := range p.TraceEvents {
		assert.Equal(t, tracePID, e.Pid)
		switch {
		case e.Ph == "M" && e.Name == "thread_name":
			threadNames[e.Tid] = e.Args["name"].(string)
		case e.Ph == "M":
		default:
			d := 0.0
			if e.Dur != nil {
				d = *e.Dur
			}
			got = append(got, ev{e.Ph, threadNames[e.Tid], e.Ts, d})
			byName[e.Name] = e.Args
			if e.Ph == "i" {
				assert.Equal(t, "t", e.S, "instants are thread-scoped")
			}
		}
	}
	assert.Equal(t, map[int]string{1: "neon:0{cpus=1}", 2: "opencl:0"}, threadNames,
		"one tid per track, in order of first use, named before use")
	assert.Equal(t, []ev{
		{"X", "neon:0{cpus=1}", 10, 25},
		{"X", "opencl:0", 20, 1},
		{"i", "neon:0{cpus=1}", 35, 0},
		{"X", "opencl:0", 0, 5},
		{"X", "opencl:0", 50, 0},
	}, got)
	assert.Equal(t, map[string]any{"chunk": 0.0, "layer": 0.0}, byName["layer 0"])
	assert.Equal(t, map[string]any{"seq": 7.0}, byName["publish"])
	assert.Nil(t, byName["copy"], "no args, no args object")
}

func TestTraceArgsCopiedAndBadArgs(t *testing.T) {
	tr := NewTrace()
	args := map[string]any{"layer": 1}
	tr.Slice("u", "a", time.Now(), time.Now(), args)
	args["layer"] = 2 // the caller reuses its map
	tr.Slice("u", "bad", time.Now(), time.Now(), map[string]any{"ch": make(chan int)})
	tr.Instant("u", "after", time.Now(), nil)
	p := parseTrace(t, tr)
	names := map[string]map[string]any{}
	for _, e := range p.TraceEvents {
		if e.Ph != "M" {
			names[e.Name] = e.Args
		}
	}
	assert.Equal(t, 1.0, names["a"]["layer"])
	assert.Contains(t, names["bad"]["error"], "not encodable", "a bad value spoils its own event's args only")
	assert.Contains(t, names, "after")
}

func TestTraceNil(t *testing.T) {
	var tr *Trace
	tr.Slice("u", "x", time.Now(), time.Now(), nil)
	tr.Instant("u", "x", time.Now(), nil)
	assert.Equal(t, 0, tr.Len())
	assert.ErrorIs(t, tr.WriteJSON(&bytes.Buffer{}), core.ErrInvalidArgument)
	assert.ErrorIs(t, tr.WriteFile(filepath.Join(t.TempDir(), "t.json")), core.ErrInvalidArgument)
}

func TestTraceConcurrent(t *testing.T) {
	tr := NewTrace()
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			track := fmt.Sprintf("unit%d", w%3)
			for i := range each {
				now := time.Now()
				tr.Slice(track, "task", now, now.Add(time.Microsecond), map[string]any{"i": i})
				if i%50 == 0 {
					var buf bytes.Buffer
					assert.NoError(t, tr.WriteJSON(&buf)) // writing while others record
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, workers*each, tr.Len())
	p := parseTrace(t, tr)
	tids := map[int]bool{}
	n := 0
	for _, e := range p.TraceEvents {
		if e.Ph == "X" {
			n++
			tids[e.Tid] = true
		}
	}
	assert.Equal(t, workers*each, n)
	assert.Len(t, tids, 3)
}

func TestTraceWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.json")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o600))
	tr := NewTrace()
	tr.Slice("neon:0", "step", time.Now(), time.Now().Add(time.Millisecond), nil)
	require.NoError(t, tr.WriteFile(path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var p parsedTrace
	require.NoError(t, json.Unmarshal(b, &p))
	assert.Len(t, p.TraceEvents, 4) // process_name, thread_name, thread_sort_index, the slice
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left behind")

	err = tr.WriteFile(filepath.Join(dir, "no", "such", "dir", "t.json"))
	assert.Error(t, err)
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}
