// Command perfgen keeps docs/PERFORMANCE.md: it renders one table per area from the stored
// results in lab/results/*.jsonl, and records a new figure there, replacing the earlier figure
// of the same area, name and machine, so that a rerun replaces a row instead of adding one
// (the model is llama.cpp's compare-llama-bench.py, which renders tables from stored runs).
//
//	go run ./lab/perfgen                      # rewrite docs/PERFORMANCE.md
//	go run ./lab/perfgen -check               # fail if docs/PERFORMANCE.md is not what the results give
//	go run ./lab/perfgen record --area llm --name "1B Q4_0 tg128" --value 25.4 --unit tok/s \
//	    --machine "$(machine)" --commit abc1234 --date 2026-01-02 --command "bench/vs-llamacpp.sh ..."
//
// bench/lib.sh's `record_result` calls the last form with the machine line it measures.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Result is one stored figure, one line of lab/results/<area>.jsonl.
type Result struct {
	Area    string `json:"area"`
	Name    string `json:"name"`
	Value   string `json:"value"` // as measured, with the precision the harness printed
	Unit    string `json:"unit"`
	Note    string `json:"note,omitempty"` // what it is compared with, the ratio, the spread
	Machine string `json:"machine"`        // CPU model, ISA path, read bandwidth
	Commit  string `json:"commit"`
	Date    string `json:"date"` // YYYY-MM-DD, UTC
	Command string `json:"command"`
}

// areas are the tables' order and titles; an area not listed here follows them, by name.
var areas = []struct{ id, title string }{
	{"kernels", "CPU kernels of the neon plugin"},
	{"llm", "Model prefill and decode, xpu beside llama.cpp"},
	{"spec", "Speculative decoding"},
	{"multiunit", "One model on two units"},
	{"sparse", "Sparse FFN under a memory limit"},
	{"host", "Plugin calls"},
	{"accuracy", "W8A8 accuracy (logits against F32)"},
	{"tokenizer", "Tokenizer"},
	{"startup", "Start time and memory, xpu run beside llama-simple"},
}

var (
	areaID  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	isoDate = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
)

// ErrInvalid is returned for a result that lacks a field or has a malformed one.
var ErrInvalid = errors.New("invalid result")

func (r Result) validate() error {
	switch {
	case !areaID.MatchString(r.Area):
		return fmt.Errorf("%w: area %q (lower case letters, digits, -)", ErrInvalid, r.Area)
	case strings.TrimSpace(r.Name) == "", strings.TrimSpace(r.Value) == "", strings.TrimSpace(r.Machine) == "",
		strings.TrimSpace(r.Commit) == "", strings.TrimSpace(r.Command) == "":
		return fmt.Errorf("%w: %s/%q: name, value, machine, commit and command are required", ErrInvalid, r.Area, r.Name)
	case !isoDate.MatchString(r.Date):
		return fmt.Errorf("%w: %s/%q: date %q is not YYYY-MM-DD", ErrInvalid, r.Area, r.Name, r.Date)
	}
	for _, s := range []string{r.Name, r.Value, r.Unit, r.Note, r.Machine, r.Commit, r.Command} {
		if strings.ContainsAny(s, "\r\n") {
			return fmt.Errorf("%w: %s/%q: a field holds a line break, which would break the table", ErrInvalid, r.Area, r.Name)
		}
	}
	return nil
}

// Load reads every lab/results/*.jsonl under dir, in file name order.
func Load(dir string) ([]Result, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Result
	for _, f := range files {
		rs, err := readFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

func readFile(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Result
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		var r Result
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// Record stores r in dir/<area>.jsonl: in place of the result with the same name and machine,
// else at the end.
func Record(dir string, r Result) error {
	if err := r.validate(); err != nil {
		return err
	}
	path := filepath.Join(dir, r.Area+".jsonl")
	rs, err := readFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	replaced := false
	for i := range rs {
		if rs[i].Name == r.Name && rs[i].Machine == r.Machine {
			rs[i], replaced = r, true
		}
	}
	if !replaced {
		rs = append(rs, r)
	}
	var b bytes.Buffer
	for _, x := range rs {
		line, err := json.Marshal(x)
		if err != nil {
			return err
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Render writes docs/PERFORMANCE.md for rs: the machines, then one table per area, the areas
// in the order of areas and the rows in the order they are stored.
func Render(w io.Writer, rs []Result) error {
	byArea := map[string][]Result{}
	for _, r := range rs {
		byArea[r.Area] = append(byArea[r.Area], r)
	}
	var ids []string
	titles := map[string]string{}
	for _, a := range areas {
		titles[a.id] = a.title
		if len(byArea[a.id]) > 0 {
			ids = append(ids, a.id)
		}
	}
	var extra []string
	for id := range byArea {
		if _, ok := titles[id]; !ok {
			extra = append(extra, id)
		}
	}
	sort.Strings(extra)
	ids = append(ids, extra...)
	// machines are numbered in the order the tables name them
	machines := map[string]string{}
	var order []string
	for _, id := range ids {
		for _, r := range byArea[id] {
			if _, ok := machines[r.Machine]; !ok {
				machines[r.Machine] = fmt.Sprintf("M%d", len(order)+1)
				order = append(order, r.Machine)
			}
		}
	}
	b := &strings.Builder{}
	b.WriteString("# Performance\n\n")
	b.WriteString("<!-- GENERATED by `go run ./lab/perfgen` from lab/results/*.jsonl: do not edit; rerun a harness\n")
	b.WriteString("     (bench/*.sh, which record through bench/lib.sh) or `go run ./lab/perfgen record`. -->\n\n")
	b.WriteString("The current figures, one row each: what was measured, on which machine, at which commit and\n")
	b.WriteString("date, by which command. A rerun replaces its row (same area, figure and machine). How they were\n")
	b.WriteString("reached, and every earlier figure, is in [lab/notes/](../lab/notes/). A commit marked `*` is\n")
	b.WriteString("the one that recorded the figure, where the note does not name the tree it measured. Figures\n")
	b.WriteString("from the emulated QNN or Core ML runtimes are never hardware figures.\n\n")
	b.WriteString("## Machines\n\n| id | CPU, ISA path, read bandwidth |\n|---|---|\n")
	for _, m := range order {
		fmt.Fprintf(b, "| %s | %s |\n", machines[m], cell(m))
	}
	for _, id := range ids {
		title := titles[id]
		if title == "" {
			title = id
		}
		fmt.Fprintf(b, "\n## %s\n\n| figure | value | beside it | machine | commit | date | command |\n|---|--:|---|---|---|---|---|\n", title)
		for _, r := range byArea[id] {
			v := r.Value
			if r.Unit != "" {
				v += " " + r.Unit
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | `%s` | %s | `%s` |\n", cell(r.Name), cell(v), cell(r.Note), machines[r.Machine],
				cell(r.Commit), r.Date, cell(r.Command))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell escapes a table cell's pipes (GitHub's tables take \| inside code spans too).
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "record" {
		return record(args[1:], stderr)
	}
	fs := flag.NewFlagSet("perfgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	results := fs.String("results", "lab/results", "the stored results")
	out := fs.String("o", "docs/PERFORMANCE.md", "the page to write")
	check := fs.Bool("check", false, "write nothing; fail if the page differs from what the results give")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rs, err := Load(*results)
	if err != nil {
		fmt.Fprintf(stderr, "perfgen: %v\n", err)
		return 1
	}
	var b bytes.Buffer
	if err := Render(&b, rs); err != nil {
		fmt.Fprintf(stderr, "perfgen: %v\n", err)
		return 1
	}
	if *check {
		old, err := os.ReadFile(*out)
		if err != nil || !bytes.Equal(old, b.Bytes()) {
			fmt.Fprintf(stderr, "perfgen: %s is not what %s gives: run go run ./lab/perfgen\n", *out, *results)
			return 1
		}
		return 0
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintf(stderr, "perfgen: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "perfgen: %s: %d figures\n", *out, len(rs))
	return 0
}

func record(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("perfgen record", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("results", "lab/results", "the stored results")
	var r Result
	fs.StringVar(&r.Area, "area", "", "the table: "+strings.Join(areaIDs(), ", ")+" or a new one")
	fs.StringVar(&r.Name, "name", "", "what was measured")
	fs.StringVar(&r.Value, "value", "", "the figure")
	fs.StringVar(&r.Unit, "unit", "", "its unit")
	fs.StringVar(&r.Note, "note", "", "what it is compared with, the ratio, the spread")
	fs.StringVar(&r.Machine, "machine", "", "CPU model, ISA path, read bandwidth (bench/lib.sh's machine)")
	fs.StringVar(&r.Commit, "commit", "", "the commit measured")
	fs.StringVar(&r.Date, "date", "", "YYYY-MM-DD (UTC)")
	fs.StringVar(&r.Command, "command", "", "the command that measured it")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := Record(*dir, r); err != nil {
		fmt.Fprintf(stderr, "perfgen record: %v\n", err)
		return 1
	}
	return 0
}

func areaIDs() []string {
	var ids []string
	for _, a := range areas {
		ids = append(ids, a.id)
	}
	return ids
}
