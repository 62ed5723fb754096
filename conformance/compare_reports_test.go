package conformance

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCompareReportsKinds(t *testing.T) {
	th := func(nmse, maxAbs float64) *Threshold { return &Threshold{NMSE: nmse, MaxAbs: maxAbs} }
	pass := func(name, prec string, t *Threshold) CaseResult {
		return CaseResult{Name: name, Status: StatusPass, Precision: prec, Threshold: t}
	}
	old := &Report{Cases: []CaseResult{
		pass("A", "f32", th(1e-6, 1e-4)),
		pass("B", "f32", th(1e-6, 1e-4)),
		pass("C", "f32", th(1e-6, 1e-4)),
		pass("D", "f32", th(1e-6, 1e-4)),
		pass("E", "f32", th(1e-6, 1e-4)),
		{Name: "F", Status: StatusFail, Category: CatMismatch},
		{Name: "G", Status: StatusUnsupported, Reason: "no"},
	}}
	new := &Report{Cases: []CaseResult{
		{Name: "A", Status: StatusFail, Category: CatMismatch, Errors: []string{"NMSE 1 > 1e-6"}},
		{Name: "B", Status: StatusUnsupported, Reason: "graph_analyze: no"},
		pass("C", "f16", th(5e-4, 1e-2)),
		pass("D", "f32", th(1e-7, 1e-5)), // tighter: not a regression
		pass("F", "f32", th(1e-6, 1e-4)), // fixed: not a regression
		pass("G", "f32", th(1e-6, 1e-4)), // newly supported: not a regression
		{Name: "H", Status: StatusFail, Category: CatNaN, Errors: []string{"NaN at 3"}},
		pass("I", "f32", th(1e-6, 1e-4)),
	}}
	got := CompareReports(old, new)
	want := []Regression{
		{"A", RegNowFailing, "[mismatch] NMSE 1 > 1e-6"},
		{"B", RegNowUnsupported, "graph_analyze: no"},
		{"C", RegLooserBound, "precision f32 -> f16, nmse bound 1e-06 -> 0.0005, max-abs bound 0.0001 -> 0.01"},
		{"E", RegVanished, "passed before, not in the new report"},
		{"H", RegNewFailure, "[nan] NaN at 3"},
	}
	assert.Equal(t, want, got)
	assert.Empty(t, CompareReports(old, old))
}

// A regression planted in a plugin (RELU writes a NaN) is found between the intact plugin's
// report and the mutant's, read back from their JSON files.
func TestCompareFindsPlantedRegression(t *testing.T) {
	plugins := buildMutants(t, "", "MUT_NAN")
	filter := WithFilter(regexp.MustCompile(`^(RELU|NEG)\(dtype=f32,`))
	dirOld, dirNew := t.TempDir(), t.TempDir()
	runPlugin(t, plugins[""], filter, WithReportDir(dirOld))
	runPlugin(t, plugins["MUT_NAN"], filter, WithReportDir(dirNew))
	old, err := ReadReport(filepath.Join(dirOld, "testplugin.json"))
	require.NoError(t, err)
	new, err := ReadReport(filepath.Join(dirNew, "testplugin.json"))
	require.NoError(t, err)
	require.NotEmpty(t, old.Cases)

	regs := CompareReports(old, new)
	require.NotEmpty(t, regs)
	for _, r := range regs {
		assert.Equal(t, RegNowFailing, r.Kind, r.Case)
		assert.True(t, strings.HasPrefix(r.Case, "RELU("), r.Case)
	}
	var out strings.Builder
	require.NoError(t, WriteRegressions(&out, regs))
	assert.Contains(t, out.String(), "REGRESSION now-failing: RELU(dtype=f32,shape=[17]): [nan]")
	assert.Empty(t, CompareReports(old, old))

	_, err = ReadReport(filepath.Join(dirOld, "testplugin.md"))
	assert.Error(t, err, "a Markdown file is no JSON report")
}
