package llmbench

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrFormat: an output format other than md, json or csv.
var ErrFormat = errors.New("llmbench: unknown output format")

// Formats are the output formats NewWriter knows, llama-bench's -o values.
var Formats = []string{"md", "json", "csv"}

// Writer prints results as they arrive; Flush ends the output (the JSON array is written whole
// at Flush, the Markdown and CSV rows as they come, so a long run shows its progress).
type Writer interface {
	Write(Result) error
	Flush() error
}

// NewWriter returns the writer of format ("md", "json" or "csv") on w.
func NewWriter(format string, w io.Writer) (Writer, error) {
	switch format {
	case "md":
		return &mdWriter{w: w}, nil
	case "json":
		return &jsonWriter{w: w}, nil
	case "csv":
		return &csvWriter{w: csv.NewWriter(w)}, nil
	}
	return nil, fmt.Errorf("%w %q (one of %s)", ErrFormat, format, strings.Join(Formats, ", "))
}

// Record is one result in llama-bench's JSON/CSV field names, plus xpu's own (device, chunk,
// n_depth for older llama-bench builds that have no depth).
type Record struct {
	ModelFilename string    `json:"model_filename"`
	ModelType     string    `json:"model_type"`
	ModelSize     int64     `json:"model_size"`
	ModelNParams  int64     `json:"model_n_params"`
	Backends      string    `json:"backends"`
	Device        string    `json:"device"`
	NThreads      int       `json:"n_threads"`
	Chunk         int       `json:"chunk"`
	TypeK         string    `json:"type_k"`
	TypeV         string    `json:"type_v"`
	NPrompt       int       `json:"n_prompt"`
	NGen          int       `json:"n_gen"`
	NDepth        int       `json:"n_depth"`
	TestTime      time.Time `json:"test_time"`
	AvgNs         int64     `json:"avg_ns"`
	StddevNs      int64     `json:"stddev_ns"`
	AvgTs         float64   `json:"avg_ts"`
	StddevTs      float64   `json:"stddev_ts"`
	SamplesNs     []int64   `json:"samples_ns"`
	SamplesTs     []float64 `json:"samples_ts"`
}

// Record converts r.
func (r Result) Record() Record {
	ns := make([]float64, len(r.Samples))
	rec := Record{
		ModelFilename: r.Model.Filename, ModelType: r.Model.Type, ModelSize: r.Model.Size,
		ModelNParams: r.Model.Params, Backends: r.Backend, Device: r.Device, NThreads: r.Threads,
		Chunk: r.Chunk, TypeK: r.KV.String(), TypeV: r.VType().String(), NPrompt: r.Test.Prompt,
		NGen: r.Test.Gen, NDepth: r.Test.Depth, TestTime: r.Time.UTC(),
		SamplesNs: make([]int64, len(r.Samples)), SamplesTs: r.Rates(),
	}
	for i, d := range r.Samples {
		rec.SamplesNs[i] = d.Nanoseconds()
		ns[i] = float64(d.Nanoseconds())
	}
	avg, sd := meanStd(ns)
	rec.AvgNs, rec.StddevNs = int64(math.Round(avg)), int64(math.Round(sd))
	rec.AvgTs, rec.StddevTs = r.TokensPerSecond()
	return rec
}

type jsonWriter struct {
	w    io.Writer
	recs []Record
}

func (j *jsonWriter) Write(r Result) error {
	j.recs = append(j.recs, r.Record())
	return nil
}

func (j *jsonWriter) Flush() error {
	recs := j.recs
	if recs == nil {
		recs = []Record{} // "[]", not "null": the reader expects an array
	}
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return fmt.Errorf("llmbench: %w", err)
	}
	_, err = fmt.Fprintf(j.w, "%s\n", b)
	return err
}

// csvHeader is Record's fields in order.
var csvHeader = []string{"model_filename", "model_type", "model_size", "model_n_params", "backends",
	"device", "n_threads", "chunk", "type_k", "type_v", "n_prompt", "n_gen", "n_depth", "test_time",
	"avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"}

type csvWriter struct {
	w      *csv.Writer
	header bool
}

func (c *csvWriter) Write(r Result) error {
	if !c.header {
		if err := c.w.Write(csvHeader); err != nil {
			return err
		}
		c.header = true
	}
	rec := r.Record()
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	ftoa := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	ns := make([]string, len(rec.SamplesNs))
	ts := make([]string, len(rec.SamplesTs))
	for i := range ns {
		ns[i], ts[i] = itoa(rec.SamplesNs[i]), ftoa(rec.SamplesTs[i])
	}
	err := c.w.Write([]string{rec.ModelFilename, rec.ModelType, itoa(rec.ModelSize), itoa(rec.ModelNParams),
		rec.Backends, rec.Device, itoa(int64(rec.NThreads)), itoa(int64(rec.Chunk)), rec.TypeK, rec.TypeV,
		itoa(int64(rec.NPrompt)), itoa(int64(rec.NGen)), itoa(int64(rec.NDepth)),
		rec.TestTime.Format(time.RFC3339), itoa(rec.AvgNs), itoa(rec.StddevNs), ftoa(rec.AvgTs),
		ftoa(rec.StddevTs), strings.Join(ns, " "), strings.Join(ts, " ")})
	if err != nil {
		return err
	}
	c.w.Flush() // row by row, so a long run's progress shows
	return c.w.Error()
}

func (c *csvWriter) Flush() error {
	if !c.header {
		if err := c.w.Write(csvHeader); err != nil {
			return err
		}
		c.header = true
	}
	c.w.Flush()
	return c.w.Error()
}

// mdColumns are the Markdown table's columns, right-aligned where numeric (llama-bench's table
// with xpu's device, chunk and KV type added).
var mdColumns = []struct {
	name  string
	right bool
}{{"model", false}, {"size", true}, {"params", true}, {"device", false}, {"threads", true},
	{"chunk", true}, {"kv", false}, {"test", true}, {"t/s", true}}

type mdWriter struct {
	w      io.Writer
	header bool
}

func (m *mdWriter) writeHeader() error {
	if m.header {
		return nil
	}
	m.header = true
	names := make([]string, len(mdColumns))
	rules := make([]string, len(mdColumns))
	for i, c := range mdColumns {
		names[i] = c.name
		rules[i] = "---"
		if c.right {
			rules[i] = "--:"
		}
	}
	_, err := fmt.Fprintf(m.w, "| %s |\n| %s |\n", strings.Join(names, " | "), strings.Join(rules, " | "))
	return err
}

func (m *mdWriter) Write(r Result) error {
	if err := m.writeHeader(); err != nil {
		return err
	}
	mean, sd := r.TokensPerSecond()
	threads := "default"
	if r.Threads > 0 {
		threads = strconv.Itoa(r.Threads)
	}
	cells := []string{r.Model.Type, humanBytes(r.Model.Size), humanParams(r.Model.Params), r.Device,
		threads, strconv.Itoa(r.Chunk), r.kvLabel(), r.Test.Name(), fmt.Sprintf("%.2f ± %.2f", mean, sd)}
	_, err := fmt.Fprintf(m.w, "| %s |\n", strings.Join(cells, " | "))
	return err
}

func (m *mdWriter) Flush() error { return m.writeHeader() }

// humanBytes and humanParams print sizes as llama-bench's table does.
func humanBytes(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
}

func humanParams(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f B", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	}
	return fmt.Sprintf("%.2f K", float64(n)/1e3)
}
