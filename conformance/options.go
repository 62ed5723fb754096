package conformance

import (
	"context"
	"io"
	"regexp"

	"github.com/xpuhub/xpu/abi"
	"github.com/xpuhub/xpu/core"
	"github.com/xpuhub/xpu/core/ref"
)

// ReferenceFunc computes a graph's outputs from its inputs (graph input order), as ref.Run.
type ReferenceFunc func(ctx context.Context, g *core.Graph, inputs [][]byte) ([][]byte, error)

type config struct {
	device      int
	filter      *regexp.Regexp
	seed        uint64
	reportDir   string
	progress    io.Writer
	repro       string
	reference   ReferenceFunc
	tolerances  Tolerances
	plugin      *abi.Plugin
	levels      map[int]bool
	analyzeOnly bool // coverage: a case ends once prepared (WithAnalyzeOnly)
	abiRunner   func(ctx context.Context) ([]CaseResult, error)
	version     string // WithBuild
	commit      string
}

// Option configures Run.
type Option func(*config)

// WithDevice tests the device with that index (default 0).
func WithDevice(i int) Option { return func(c *config) { c.device = i } }

// WithFilter runs only the cases whose name matches re.
func WithFilter(re *regexp.Regexp) Option { return func(c *config) { c.filter = re } }

// WithSeed changes every case's inputs (default 0). A failing case's rerun command carries it.
func WithSeed(seed uint64) Option { return func(c *config) { c.seed = seed } }

// WithReportDir writes <backend>.json, <backend>.md and <backend>.xml into dir.
func WithReportDir(dir string) Option { return func(c *config) { c.reportDir = dir } }

// WithProgress prints one line per case to w as the suite runs.
func WithProgress(w io.Writer) Option { return func(c *config) { c.progress = w } }

// WithReproCommand sets the command a failing case's rerun line starts with, such as
// "xpu conform --plugin neon" (default: built from the backend's path or name).
func WithReproCommand(cmd string) Option { return func(c *config) { c.repro = cmd } }

// WithReference replaces core/ref as the source of expected results.
func WithReference(f ReferenceFunc) Option { return func(c *config) { c.reference = f } }

// WithTolerances replaces the TOLERANCES.md table.
func WithTolerances(t Tolerances) Option { return func(c *config) { c.tolerances = t } }

// WithPlugin gives the raw ABI binding of the backend under test, for the level-1 (ABI and
// lifecycle) cases. By default it is abi.PluginOf(backend); without one (the reference, an
// isolated plugin) level 1 is skipped.
func WithPlugin(p *abi.Plugin) Option { return func(c *config) { c.plugin = p } }

// WithABIRunner gives the level-1 (raw ABI) cases to run when the backend is not loaded in this
// process (an isolated plugin), so that both modes run the same levels: run returns their
// results, typically from a child process that loads the plugin file and runs level 1 in
// process (a crash there fails a case, not the suite). Results whose names are not level-1
// cases of this suite (a failure at the child's end, such as a shutdown that leaks) are added
// after the suite's cases. Without it, level 1 is skipped for such a backend.
func WithABIRunner(run func(ctx context.Context) ([]CaseResult, error)) Option {
	return func(c *config) { c.abiRunner = run }
}

// WithLevels runs only the given levels (1 ABI, 2 ops, 3 buffers, 4 graphs, 5 models).
func WithLevels(levels ...int) Option {
	return func(c *config) {
		c.levels = map[int]bool{}
		for _, l := range levels {
			c.levels[l] = true
		}
	}
}

func newConfig(opts []Option) config {
	c := config{reference: ref.Run}
	for _, o := range opts {
		o(&c)
	}
	return c
}
