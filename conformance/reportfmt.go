package conformance

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// WriteFiles writes <backend>.json, <backend>.md, <backend>.xml and <backend>.html into dir
// (created if missing). The file name is the backend's name, with the device index when it is not 0.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("conformance: report folder: %w", err)
	}
	base := filepath.Join(dir, r.FileBase())
	for _, f := range []struct {
		ext   string
		write func(io.Writer) error
	}{{".json", r.WriteJSON}, {".md", r.WriteMarkdown}, {".xml", r.WriteJUnit}, {".html", r.WriteHTML}} {
		if err := writeFile(base+f.ext, f.write); err != nil {
			return err
		}
	}
	return nil
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// FileBase is the report files' name without extension.
func (r *Report) FileBase() string {
	// leading dots go too: a backend named ".." would otherwise write "<dir>/.." + ".json",
	// outside the report folder, and "." or ".x" hidden files
	name := strings.TrimLeft(unsafeName.ReplaceAllString(r.Backend.Name, "_"), ".")
	if name == "" {
		name = "backend"
	}
	if r.Device.Index != 0 {
		name += fmt.Sprintf("-%d", r.Device.Index)
	}
	return name
}

// reportExts are the report files' extensions, one per format.
var reportExts = []string{".json", ".md", ".xml", ".html"}

// RemoveFiles deletes this report's files (same backend and device) that an earlier run left
// in dir. Run calls it before the first case, so that a run that dies half way (a plugin that
// ends the process) leaves no earlier report behind that would pass for its result.
func (r *Report) RemoveFiles(dir string) error {
	return removeReportFiles(dir, r.FileBase())
}

// RemoveReportFiles deletes the report files an earlier run left in dir for backend (by name)
// and device: for a backend that cannot even be opened now, whose earlier report would
// otherwise stay in place as if it were current.
func RemoveReportFiles(dir, backend string, device int) error {
	r := Report{Backend: BackendRecord{Name: backend}, Device: DeviceRecord{Index: device}}
	return r.RemoveFiles(dir)
}

func removeReportFiles(dir, base string) error {
	base = filepath.Join(dir, base)
	for _, ext := range reportExts {
		if err := os.Remove(base + ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("conformance: removing the previous report: %w", err)
		}
	}
	return nil
}

// writeFile writes path atomically: into a temporary file of the same folder, renamed into
// place once complete, so that a reader (or a crash) never sees half a report.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("conformance: %w", err)
	}
	tmp := f.Name()
	err = write(f)
	if err != nil {
		err = fmt.Errorf("conformance: writing %s: %w", path, err)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("conformance: %w", cerr)
	}
	if err == nil {
		// CreateTemp makes the file 0600; a report is as readable as any other build output
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// WriteJSON writes the whole report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type cell struct{ pass, fail, unsup, skip int }

func (c cell) String() string {
	switch {
	case c.fail > 0:
		return fmt.Sprintf("✗ %d/%d failed", c.fail, c.pass+c.fail)
	case c.pass > 0 && c.unsup > 0:
		return fmt.Sprintf("✓ %d (%d unsupported)", c.pass, c.unsup)
	case c.pass > 0:
		return fmt.Sprintf("✓ %d", c.pass)
	case c.unsup > 0:
		return "– unsupported"
	case c.skip > 0:
		return "skipped"
	}
	return ""
}

// WriteMarkdown writes a summary a vendor can paste into a README: the op × dtype table, the
// other levels, and every failure with its rerun command.
func (r *Report) WriteMarkdown(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "# xpu conformance: %s\n\n", r.Backend.Name)
	fmt.Fprintf(b, "- plugin: %s %s (%s), build %s\n", r.Backend.Name, r.Backend.Version, r.Backend.Vendor, r.Backend.BuildID)
	if r.Backend.SDKVersion != "" {
		fmt.Fprintf(b, "- SDK: %s\n", r.Backend.SDKVersion)
	}
	fmt.Fprintf(b, "- device %d: %s (%s, %s)", r.Device.Index, r.Device.Name, r.Device.Kind, r.Device.Vendor)
	if caps := strings.Join(r.Device.Caps, ","); caps != "" {
		fmt.Fprintf(b, ", caps: %s", caps)
	}
	b.WriteString("\n")
	for _, l := range r.provenanceLines() {
		fmt.Fprintf(b, "- %s\n", l)
	}
	fmt.Fprintf(b, "- seed %d, %s, %.1f s\n\n**%s**", r.Seed, r.Started.Format("2006-01-02 15:04 UTC"), r.Seconds, r.Summary())
	if r.Skipped > 0 {
		fmt.Fprintf(b, ", %d skipped", r.Skipped)
	}
	writeLevelsMarkdown(b, r.Levels)
	b.WriteString("\n\n## Ops (level 2)\n\n")
	cells := map[string]map[string]*cell{}
	var dtypes []string
	seen := map[string]bool{}
	other := map[int][]CaseResult{}
	for _, c := range r.Cases {
		if c.Level != 2 {
			other[c.Level] = append(other[c.Level], c)
			continue
		}
		if cells[c.Op] == nil {
			cells[c.Op] = map[string]*cell{}
		}
		if cells[c.Op][c.DType] == nil {
			cells[c.Op][c.DType] = &cell{}
		}
		if !seen[c.DType] {
			seen[c.DType] = true
			dtypes = append(dtypes, c.DType)
		}
		count(cells[c.Op][c.DType], c.Status)
	}
	sort.Strings(dtypes)
	ops := make([]string, 0, len(cells))
	for op := range cells {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	if len(ops) > 0 {
		writeMatrix(b, ops, cells)
		b.WriteString("\nIn detail (number of shape and attribute cases):\n\n")
		b.WriteString("| op | dtype | result |\n|---|---|---|\n")
		for _, op := range ops {
			for _, dt := range dtypes {
				if c := cells[op][dt]; c != nil {
					fmt.Fprintf(b, "| %s | %s | %s |\n", op, dt, c)
				}
			}
		}
	}
	levelNames := map[int]string{1: "ABI and lifecycle (level 1)", 3: "Buffers (level 3)", 4: "Graphs (level 4)", 5: "Models (level 5)"}
	for _, l := range []int{1, 3, 4, 5} {
		if len(other[l]) == 0 {
			continue
		}
		fmt.Fprintf(b, "\n## %s\n\n| case | result |\n|---|---|\n", levelNames[l])
		for _, c := range other[l] {
			res := string(c.Status)
			if c.Status == StatusFail {
				res = "✗ " + string(c.Category)
			} else if c.Status == StatusPass {
				res = "✓"
			}
			fmt.Fprintf(b, "| `%s` | %s |\n", c.Name, res)
		}
	}
	if fails := r.Failures(); len(fails) > 0 {
		b.WriteString("\n## Failures\n")
		for _, c := range fails {
			fmt.Fprintf(b, "\n### `%s`: %s\n\n", c.Name, c.Category)
			for _, e := range c.Errors {
				fmt.Fprintf(b, "- %s\n", e)
			}
			fmt.Fprintf(b, "\nRerun: `%s`\n", c.Repro)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func count(c *cell, s Status) {
	switch s {
	case StatusPass:
		c.pass++
	case StatusFail:
		c.fail++
	case StatusUnsupported:
		c.unsup++
	case StatusSkipped:
		c.skip++
	}
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       float64         `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr,omitempty"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitCase struct {
	Class   string        `xml:"classname,attr"`
	Name    string        `xml:"name,attr"`
	Time    float64       `xml:"time,attr"`
	Failure *junitFailure `xml:"failure,omitempty"`
	Skipped *junitSkipped `xml:"skipped,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

type junitSkipped struct {
	Message string `xml:"message,attr"`
}

// WriteJUnit writes the cases as JUnit XML (unsupported and skipped cases as skipped).
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: "xpu-conformance." + r.FileBase(), Tests: len(r.Cases), Failures: r.Failed,
		Skipped: r.Unsupported + r.Skipped, Time: r.Seconds, Timestamp: r.Started.Format("2006-01-02T15:04:05"),
		Properties: r.junitProperties()}
	for _, c := range r.Cases {
		jc := junitCase{Class: fmt.Sprintf("conformance.level%d.%s", c.Level, c.Op), Name: c.Name, Time: c.Seconds}
		switch c.Status {
		case StatusFail:
			jc.Failure = &junitFailure{Message: firstOr(c.Errors, string(c.Category)), Type: string(c.Category),
				Text: strings.Join(c.Errors, "\n") + "\nrerun: " + c.Repro}
		case StatusUnsupported, StatusSkipped:
			jc.Skipped = &junitSkipped{Message: string(c.Status) + ": " + c.Reason}
		}
		s.Cases = append(s.Cases, jc)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	suites := junitSuites{Suites: []junitSuite{s}}
	if len(r.Levels) > 0 {
		suites.Suites = append(suites.Suites, levelSuite(r.FileBase(), r.Levels))
	}
	if err := enc.Encode(suites); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func firstOr(xs []string, def string) string {
	if len(xs) > 0 {
		return xs[0]
	}
	return def
}

// matrixDTypes are the columns of the support matrix.
var matrixDTypes = []string{"f32", "f16", "bf16", "i32", "i8", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q2_k", "q3_k"}

// matrixColumn maps a dtype label to its matrix column: the last dtype named, which is
// MATMUL's weight, ATTENTION's K/V and CAST's target.
func matrixColumn(label string) string {
	if i := strings.LastIndexAny(label, "/>"); i >= 0 {
		return label[i+1:]
	}
	return label
}

// writeMatrix writes the op × dtype support matrix a vendor pastes into a README.
func writeMatrix(b *strings.Builder, ops []string, cells map[string]map[string]*cell) {
	b.WriteString("| op | " + strings.Join(matrixDTypes, " | ") + " |\n|---|")
	b.WriteString(strings.Repeat("---|", len(matrixDTypes)) + "\n")
	for _, op := range ops {
		agg := map[string]*cell{}
		for label, c := range cells[op] {
			col := matrixColumn(label)
			if agg[col] == nil {
				agg[col] = &cell{}
			}
			agg[col].pass += c.pass
			agg[col].fail += c.fail
			agg[col].unsup += c.unsup
			agg[col].skip += c.skip
		}
		b.WriteString("| " + op + " |")
		for _, dt := range matrixDTypes {
			mark := ""
			if c := agg[dt]; c != nil {
				switch {
				case c.fail > 0:
					mark = "✗"
				case c.pass > 0 && c.unsup > 0:
					mark = "✓ partly"
				case c.pass > 0:
					mark = "✓"
				case c.unsup > 0:
					mark = "–"
				}
			}
			b.WriteString(" " + mark + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n✓ every case passed, ✓ partly: the rest unsupported, ✗ a case failed, – unsupported. " +
		"The column is MATMUL's weight dtype, ATTENTION's K/V dtype and CAST's target dtype.\n")
}
