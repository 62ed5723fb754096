package conformance

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriteOpsDocCells(t *testing.T) {
	c := func(op, dt string, st Status, reason string) CaseResult {
		return CaseResult{Name: op + dt + reason, Level: CoverageLevel, Op: op, DType: dt, Status: st, Reason: reason}
	}
	a := &Report{Backend: BackendRecord{Name: "a"}, Cases: []CaseResult{
		c("ADD", "f32", StatusPass, ""), c("ADD", "f32", StatusPass, "x"),
		c("MATMUL", "f32/q4_0", StatusPass, ""), c("MATMUL", "f32/q4_0", StatusUnsupported, "graph_analyze: mm: K not a multiple of 32"),
		c("EXP", "f16", StatusUnsupported, "op_support: NO for exp (EXP f16/invalid -> f16, rank 1)"),
		c("EXP", "f16", StatusUnsupported, "op_support: NO for exp (EXP f16/invalid -> f16, rank 2)"),
		c("SOFTMAX", "f32", StatusFail, ""),
		{Name: "ABI(x)", Level: 1, Op: "ABI", Status: StatusPass}, // not an op case
	}}
	b := &Report{Backend: BackendRecord{Name: "b|c"}, Cases: []CaseResult{c("ADD", "f32", StatusPass, "")}}
	var out strings.Builder
	require.NoError(t, WriteOpsDoc(&out, []*Report{a, b}))
	doc := out.String()
	for _, row := range []string{
		"| op | dtype | a | b\\|c |",
		"| ADD | f32 | yes | yes |",
		"| EXP | f16 | no: op_support says NO | - |",
		"| MATMUL | f32/q4_0 | partial 1/2: K not a multiple of 32 | - |",
		"| SOFTMAX | f32 | FAILS 1/1 | - |",
	} {
		assert.Contains(t, doc, row+"\n")
	}
	assert.NotContains(t, doc, "| ABI |")
	var again strings.Builder
	require.NoError(t, WriteOpsDoc(&again, []*Report{a, b}))
	assert.Equal(t, doc, again.String(), "the same reports, the same bytes")
}

// Analyze-only runs claim, they do not compute: a plugin whose RELU writes a NaN passes them.
func TestAnalyzeOnlyDoesNotRun(t *testing.T) {
	plugins := buildMutants(t, "MUT_NAN")
	rep := runPlugin(t, plugins["MUT_NAN"], WithFilter(regexp.MustCompile(`^RELU\(dtype=f32,`)), WithAnalyzeOnly())
	require.NotEmpty(t, rep.Cases)
	assert.Zero(t, rep.Failed)
	for _, c := range rep.Cases {
		assert.Equal(t, analyzedOnly, c.Reason, c.Name)
	}
	full := runPlugin(t, plugins["MUT_NAN"], WithFilter(regexp.MustCompile(`^RELU\(dtype=f32,`)))
	assert.Positive(t, full.Failed, "the same cases run do catch it")
}
