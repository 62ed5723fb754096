package main

import (
	"bufio"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docLine is one command line of a ```sh block in README.md or docs/*.md.
type docLine struct {
	File string // relative to the repository root
	Text string // continuation lines joined, surrounding space trimmed
}

// docFiles are the documents whose commands the tests run: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	sort.Strings(files)
	return append([]string{filepath.Join("..", "..", "README.md")}, files...)
}

// docShellLines returns every command of the ```sh blocks of README.md and docs/*.md: blank
// lines and comments left out, a line ending in a backslash joined with the next.
func docShellLines(t *testing.T) []docLine {
	t.Helper()
	var out []docLine
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		rel, err := filepath.Rel(filepath.Join("..", ".."), f)
		require.NoError(t, err)
		in, cont := false, ""
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case strings.HasPrefix(line, "```sh"):
				in = true
			case strings.HasPrefix(line, "```"):
				in = false
			case in && (line == "" || strings.HasPrefix(line, "#")):
			case in && strings.HasSuffix(line, "\\"):
				cont += strings.TrimSuffix(line, "\\") + " "
			case in:
				out = append(out, docLine{File: rel, Text: strings.Join(strings.Fields(cont+line), " ")})
				cont = ""
			}
		}
	}
	return out
}

// readmeShellLines returns the command lines of README.md's and docs/*.md's ```sh blocks.
func readmeShellLines(t *testing.T) []string {
	var out []string
	for _, l := range docShellLines(t) {
		out = append(out, l.Text)
	}
	return out
}

// readmeLinesWhere returns the documents' command lines (readmeShellLines) that keep takes.
func readmeLinesWhere(t *testing.T, keep func(line string) bool) []string {
	var out []string
	for _, l := range readmeShellLines(t) {
		if keep(l) {
			out = append(out, l)
		}
	}
	return out
}

// docCommands maps every command line the documents show to the test that runs it: a doc
// test that picks the line out of the document and runs it as written, or a test that runs
// the same command. The first row whose pattern matches a line is its row. A line no row
// matches fails TestDocCommandsAreTested, and so does a row that matches no line (stale) or
// names a test that does not exist. To document a new command, add a row here, naming the test
// that runs it (a package other than cmd/xpu as "dir:TestName", e.g. "conformance:TestX").
var docCommands = []struct {
	pattern *regexp.Regexp
	test    string
}{
	{regexp.MustCompile(`^make (demo|test)$`), "TestMakeDemoAndTestTargets"},
	{regexp.MustCompile(`^go get github\.com/xpuhub/xpu@latest$`), "TestReadmeGoExample"},
	{regexp.MustCompile(`^build/xpu run .*--spec `), "TestREADMESpecCommand"},
	{regexp.MustCompile(`^build/xpu run .*--(grammar|grammar-file|json-schema) `), "TestRunGrammar"},
	{regexp.MustCompile(`^curl .*response_format`), "llm/serve:TestJSONSchemaResponses"},
	{docGreedyRun, "TestDocGreedyRunCommands"},
	{regexp.MustCompile(`^(echo .* \| )?build/xpu run \.\./shared/|^build/xpu serve |^curl `), "TestREADMERunAndServeCommands"},
	{regexp.MustCompile(`stories260K-q4_k_m\.gguf`), "TestREADMEQuantizeCommands"},
	{regexp.MustCompile(`stories260K-npu\.gguf|^build/xpu (calibrate|w8a8-eval) `), "TestREADMEW8A8Commands"},
	{regexp.MustCompile(`/tmp/relu-6m\.gguf`), "TestREADMESparseCommands"},
	{regexp.MustCompile(`/tmp/(\$a|[a-z0-9]+)-6m\.gguf`), "TestDocArchCommands"},
	{regexp.MustCompile(`^build/xpu (plan|tune --profile) `), "TestREADMEPlanCommands"},
	{regexp.MustCompile(`^build/xpu tune --energy --simulate sd8gen3 --seed 3$`), "TestTuneSimulated"},
	{regexp.MustCompile(`^build/xpu conform --plugin \./libxpu-mine\.so --report out/$`), "TestConformTestPlugin"},
	{regexp.MustCompile(`^build/xpu conform --plugin coreml$`), "TestDocConformanceFigures"},
	// docs/writing-a-backend.md's five steps, run as one from an empty folder
	{regexp.MustCompile(`^make install-sdk PREFIX=|^PKG_CONFIG_PATH=\S+ pkg-config --cflags xpu-backend$|^xpu backend new acme$|^cd acme && PKG_CONFIG_PATH=\S+ make$|^xpu conform --plugin \./libxpu-acme\.so$|^xpu devices -v$|^XPU_PLUGIN_PATH=\$PWD xpu run .*--units acme,neon`), "TestBackendKitOutOfTree"},
}

// docGreedyRun is a greedy run of the test model from its BOS (no prompt): its text is a
// prefix of the published sample.
// constrainedDocLine matches the documents' grammar-constrained run and request lines.
var constrainedDocLine = regexp.MustCompile(`--(grammar|grammar-file|json-schema) |response_format`)

var docGreedyRun = regexp.MustCompile(`^build/xpu run (-m |--model )\.\./shared/models/stories260K\.gguf --temp 0 -n \d+ `)

// testFuncs returns the names of the Test functions in dir's _test.go files.
func testFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	require.NoError(t, err)
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range af.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
				out[fd.Name.Name] = true
			}
		}
	}
	return out
}

// Every command the documents show is run by a test.
func TestDocCommandsAreTested(t *testing.T) {
	lines := docShellLines(t)
	require.NotEmpty(t, lines)
	used := make([]bool, len(docCommands))
	for _, l := range lines {
		row := -1
		for i, c := range docCommands {
			if c.pattern.MatchString(l.Text) {
				row = i
				break
			}
		}
		if !assert.GreaterOrEqual(t, row, 0, "%s: no test runs `%s`: add a row to docCommands (cmd/xpu/readme_test.go)", l.File, l.Text) {
			continue
		}
		used[row] = true
	}
	funcs := map[string]map[string]bool{}
	for i, c := range docCommands {
		assert.True(t, used[i], "docCommands row %q (%s) matches no document line: remove it", c.pattern, c.test)
		dir, name := ".", c.test
		if d, n, ok := strings.Cut(c.test, ":"); ok {
			dir, name = filepath.Join("..", "..", d), n
		}
		if funcs[dir] == nil {
			funcs[dir] = testFuncs(t, dir)
		}
		assert.True(t, funcs[dir][name], "docCommands names %s, which is not a test in %s", c.test, dir)
	}
}

// runDocLine runs a document's command line as written, from the repository root, with
// build/xpu being the binary the tests build, the replacements made (old, new pairs) and env
// added to the environment. The deadline only stops a hung command: the slowest line (the
// sparse plan of a 6M-parameter model) takes a minute or two on two cores.
func runDocLine(t *testing.T, line string, env []string, replace ...string) (stdout, stderr string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	line = strings.ReplaceAll(line, "build/xpu", buildXPU(t))
	line = strings.NewReplacer(replace...).Replace(line)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "%s\n%s", line, errb.String())
	return out.String(), errb.String()
}

// The documents' greedy runs of the test model (on each backend, isolated, over several units
// with a trace, on pinned cores) print a prefix of its published greedy text.
func TestDocGreedyRunCommands(t *testing.T) {
	p := storiesPath(t)
	want, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stories260K.greedy.txt"))
	require.NoError(t, err)
	var lines []docLine
	seen := map[string]bool{}
	for _, l := range docShellLines(t) {
		if docGreedyRun.MatchString(l.Text) && !strings.Contains(l.Text, "--spec ") && !seen[l.Text] {
			seen[l.Text] = true // a command two pages show runs once
			lines = append(lines, l)
		}
	}
	require.GreaterOrEqual(t, len(lines), 4, "the CLI page's run on each backend")
	for _, l := range lines {
		t.Run(l.Text, func(t *testing.T) {
			dir := t.TempDir()
			out, _ := runDocLine(t, l.Text, []string{"XPU_CACHE_DIR=" + dir}, "--trace t.json", "--trace "+filepath.Join(dir, "t.json"))
			// the CLI ends the text with a newline of its own when the model did not
			text := strings.TrimSuffix(out, "\n")
			require.NotEmpty(t, text)
			assert.True(t, strings.HasPrefix(string(want), text), "%s: %q is not a prefix of the published greedy text", l.File, out)
		})
	}
}

// make demo and make test are targets whose recipes do what the README says.
func TestMakeDemoAndTestTargets(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for target, wants := range map[string][]string{
		"demo": {"scripts/deps.sh", "xpu demo"},
		"test": {"scripts/deps.sh", "go test -race", "conform --all", "gofmt", "fuzz-ir"},
	} {
		cmd := exec.Command("make", "-n", target)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "MAKEFLAGS=")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "make -n %s:\n%s", target, out)
		for _, w := range wants {
			assert.Contains(t, string(out), w, "make %s", target)
		}
	}
}

// The README's Go example is the body of examples/generate, line for line; its go get line
// names this module; and the program runs.
func TestReadmeGoExample(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "README has no Go example")
	src, err := os.ReadFile(filepath.Join(root, "examples", "generate", "main.go"))
	require.NoError(t, err)
	var prog []string
	for _, l := range strings.Split(string(src), "\n") {
		prog = append(prog, strings.TrimSpace(l))
	}
	ex := strings.Split(strings.TrimSpace(string(m[1])), "\n")
	assert.LessOrEqual(t, len(ex), 15, "a short example")
	start := slices.Index(prog, strings.TrimSpace(ex[0]))
	require.GreaterOrEqual(t, start, 0, "examples/generate/main.go lacks %q", ex[0])
	for i, l := range ex {
		require.Less(t, start+i, len(prog))
		assert.Equal(t, strings.TrimSpace(l), prog[start+i], "README's Go example, line %d", i+1)
	}

	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	mm := regexp.MustCompile(`(?m)^module (\S+)`).FindSubmatch(mod)
	require.NotNil(t, mm)
	assert.Contains(t, string(readme), "go get "+string(mm[1])+"@latest")

	model, err := filepath.Abs(storiesPath(t))
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "generate")
	build := exec.Command("go", "build", "-o", bin, "./examples/generate")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.Command(bin, model)
	run.Dir = root
	run.Env = append(os.Environ(), "XPU_CACHE_DIR="+t.TempDir())
	var stderr strings.Builder
	run.Stderr = &stderr
	text, err := run.Output()
	require.NoError(t, err, stderr.String())
	assert.NotEmpty(t, strings.TrimSpace(string(text)))
}

// The README's layout table names every Go package folder of the module, and only folders
// that exist.
func TestReadmeLayoutListsEveryPackage(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	text := string(readme)
	i := strings.Index(text, "## Layout")
	require.GreaterOrEqual(t, i, 0, "README has no Layout section")
	section := text[i:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	listed := map[string]bool{}
	for _, row := range strings.Split(section, "\n") {
		if !strings.HasPrefix(row, "| `") {
			continue
		}
		first := strings.SplitN(row, "|", 3)[1]
		for _, p := range regexp.MustCompile("`([^`]+/)`").FindAllStringSubmatch(first, -1) {
			listed[p[1]] = true
			_, err := os.Stat(filepath.Join(root, p[1]))
			assert.NoError(t, err, "the layout lists %s, which does not exist", p[1])
		}
	}
	var missing []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		require.NoError(t, err)
		dir := filepath.ToSlash(rel) + "/"
		if !listed[dir] && !slices.Contains(missing, dir) {
			missing = append(missing, dir)
		}
		return nil
	}))
	assert.Empty(t, missing, "Go packages the README's layout table does not list")
}

// The README's llama-cli style `xpu run` lines and its `xpu serve` + curl lines, run as
// written (from the repository root, build/xpu being the binary this test builds).
func TestREADMERunAndServeCommands(t *testing.T) {
	storiesPath(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	var runs, serves, curls []string
	for _, l := range readmeShellLines(t) {
		switch {
		case constrainedDocLine.MatchString(l):
			// grammar and response_format lines: TestRunGrammar and serve's
			// TestJSONSchemaResponses run them (docCommands)
		case strings.Contains(l, "build/xpu run ../shared/"):
			runs = append(runs, l)
		case strings.HasPrefix(l, "build/xpu serve "):
			serves = append(serves, l)
		case strings.HasPrefix(l, "curl "):
			curls = append(curls, l)
		}
	}
	require.Len(t, runs, 2, "the README's llama-cli style run lines")
	require.Len(t, serves, 1)
	require.NotEmpty(t, curls)
	for _, l := range runs {
		out, _ := runDocLine(t, l, nil)
		assert.True(t, strings.HasPrefix(out, "Once upon a time"), "%s: %q", l, out)
	}

	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (scripts/deps.sh installs it): the README's curl line is not run")
	}
	args := strings.Fields(strings.TrimPrefix(serves[0], "build/xpu serve "))
	for i, a := range args {
		if a == "--port" {
			args[i+1] = "0"
		}
	}
	p := startServeIn(t, root, args...)
	host := strings.TrimPrefix(p.url, "http://")
	for _, l := range curls {
		out, err := exec.Command("bash", "-c", strings.ReplaceAll(l, "127.0.0.1:8080", host)).Output()
		require.NoError(t, err, l)
		var resp struct {
			Choices []struct {
				Message struct{ Role, Content string }
			}
		}
		require.NoError(t, json.Unmarshal(out, &resp), "%s", out)
		require.Len(t, resp.Choices, 1, "%s", out)
		assert.Equal(t, "assistant", resp.Choices[0].Message.Role)
		assert.NotEmpty(t, resp.Choices[0].Message.Content)
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, <-p.exited)
}

// The README's xpu quantize lines, run as written except that the quantized file goes to a
// temporary folder instead of the repository root.
func TestREADMEQuantizeCommands(t *testing.T) {
	storiesPath(t)
	out := filepath.Join(t.TempDir(), "stories260K-q4_k_m.gguf")
	lines := readmeLinesWhere(t, func(l string) bool { return strings.Contains(l, "stories260K-q4_k_m.gguf") })
	require.Len(t, lines, 2, "the README's quantize and run lines")
	require.True(t, strings.HasPrefix(lines[0], "build/xpu quantize "), lines[0])
	for i, l := range lines {
		got, _ := runDocLine(t, l, nil, "stories260K-q4_k_m.gguf", out)
		if i == 0 {
			assert.Contains(t, got, "q4_k_m, 48 tensors (f32 16, q8_0 32)")
		} else {
			assert.True(t, strings.HasPrefix(got, "Once upon a time"), "%s: %q", l, got)
		}
	}
}

// The README's W8A8 lines, run as written (the npu-int8 copy in a temporary folder, the cache
// there too): the copy, the calibration into the cache, greedy text with the int8 work on the
// emulated NPU, and the NMSE table.
func TestREADMEW8A8Commands(t *testing.T) {
	storiesPath(t)
	dir := t.TempDir()
	npu := filepath.Join(dir, "stories260K-npu.gguf")
	lines := readmeLinesWhere(t, func(l string) bool {
		return strings.Contains(l, "stories260K-npu.gguf") || strings.HasPrefix(l, "build/xpu calibrate ") || strings.HasPrefix(l, "build/xpu w8a8-eval ")
	})
	require.Len(t, lines, 4, "the README's W8A8 lines")
	for _, l := range lines {
		got, _ := runDocLine(t, l, []string{"XPU_CACHE_DIR=" + filepath.Join(dir, "cache")}, "stories260K-npu.gguf", npu)
		switch {
		case strings.Contains(l, " run "):
			assert.True(t, strings.HasPrefix(got, "Once upon a time"), "%s: %q", l, got)
		case strings.Contains(l, " w8a8-eval "):
			assert.Contains(t, got, "w8a8 shadow pruned (per-tensor)")
			assert.Contains(t, got, "64/64", "greedy W8A8 matches F32 for 64 tokens")
		case strings.Contains(l, " calibrate "):
			assert.Contains(t, got, filepath.Join(dir, "cache", "w8a8"))
		}
	}
}
