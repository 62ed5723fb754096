package serve

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are written in the Prometheus text exposition format (version 0.0.4) by hand: a
// handful of counters, gauges and one histogram do not need a client library.
type metrics struct {
	mu        sync.Mutex
	requests  map[[2]string]uint64 // (path, status code)
	durations map[string]*histogram
	prompt    atomic.Uint64
	generated atomic.Uint64
	inflight  atomic.Int64
	refused   atomic.Int64 // connections refused by Listener's limits
	restarts  func() int64 // backend restarts after a crash
	changed   func() bool  // the model file on disk is no longer the one loaded
}

// durationBuckets are the request duration histogram's upper bounds in seconds.
var durationBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

type histogram struct {
	counts []uint64 // per bucket, not cumulative
	sum    float64
	n      uint64
}

func newMetrics() *metrics {
	return &metrics{requests: map[[2]string]uint64{}, durations: map[string]*histogram{}}
}

func (m *metrics) tokens(prompt, generated int) {
	m.prompt.Add(uint64(prompt))
	m.generated.Add(uint64(generated))
}

// knownPaths keeps the label set bounded: any other path is counted as "other".
var knownPaths = map[string]bool{"/v1/chat/completions": true, "/v1/completions": true,
	"/v1/models": true, "/health": true, "/metrics": true}

// statusWriter records the status code; Unwrap lets http.ResponseController reach the
// connection's Flush.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (m *metrics) instrument(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		path := r.URL.Path
		if !knownPaths[path] {
			path = "other"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		d := time.Since(t0).Seconds()
		m.mu.Lock()
		defer m.mu.Unlock()
		m.requests[[2]string{path, strconv.Itoa(code)}]++
		hg := m.durations[path]
		if hg == nil {
			hg = &histogram{counts: make([]uint64, len(durationBuckets))}
			m.durations[path] = hg
		}
		for i, b := range durationBuckets {
			if d <= b {
				hg.counts[i]++
				break
			}
		}
		hg.sum += d
		hg.n++
	})
}

func (m *metrics) write(w io.Writer, queued int64, free, parallel int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintln(w, "# HELP xpu_requests_total HTTP requests answered, by path and status code.")
	fmt.Fprintln(w, "# TYPE xpu_requests_total counter")
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || (keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1])
	})
	for _, k := range keys {
		fmt.Fprintf(w, "xpu_requests_total{path=%q,code=%q} %d\n", k[0], k[1], m.requests[k])
	}
	fmt.Fprintln(w, "# HELP xpu_request_duration_seconds Time from a request's arrival to its last byte.")
	fmt.Fprintln(w, "# TYPE xpu_request_duration_seconds histogram")
	paths := make([]string, 0, len(m.durations))
	for p := range m.durations {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		hg := m.durations[p]
		var cum uint64
		for i, b := range durationBuckets {
			cum += hg.counts[i]
			fmt.Fprintf(w, "xpu_request_duration_seconds_bucket{path=%q,le=%q} %d\n", p, strconv.FormatFloat(b, 'g', -1, 64), cum)
		}
		fmt.Fprintf(w, "xpu_request_duration_seconds_bucket{path=%q,le=\"+Inf\"} %d\n", p, hg.n)
		fmt.Fprintf(w, "xpu_request_duration_seconds_sum{path=%q} %g\n", p, hg.sum)
		fmt.Fprintf(w, "xpu_request_duration_seconds_count{path=%q} %d\n", p, hg.n)
	}
	gauge := func(name, help string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	counter("xpu_prompt_tokens_total", "Prompt tokens of the completion requests run.", m.prompt.Load())
	counter("xpu_generated_tokens_total", "Tokens generated.", m.generated.Load())
	gauge("xpu_requests_generating", "Requests generating now, each on a runner.", m.inflight.Load())
	gauge("xpu_requests_queued", "Requests waiting for a free runner.", queued)
	gauge("xpu_runners", "Runners in the pool (requests that can generate at once).", int64(parallel))
	gauge("xpu_runners_free", "Runners not generating now.", int64(free))
	counter("xpu_connections_refused_total", "Connections refused by the connection limits (--max-conns, --max-conns-per-client).", uint64(m.refused.Load()))
	if m.restarts != nil {
		counter("xpu_backend_restarts_total", "Restarts of the backend after it crashed.", uint64(m.restarts()))
	}
	if m.changed != nil {
		var v int64
		if m.changed() {
			v = 1
		}
		gauge("xpu_model_file_changed", "1 once the model file on disk was replaced since the server loaded it.", v)
	}
}
