package conformance

import (
	"bytes"
	"encoding/xml"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// levelSuiteFixture is a small suite with a case of every level's subset.
func levelSuiteFixture() []testCase {
	return []testCase{
		{name: "ABI(probe-info)", level: 1, op: "ABI"},
		{name: "ABI(fences-and-submit)", level: 1, op: "ABI"},
		{name: "ABI(release-in-flight)", level: 1, op: "ABI"},
		{name: "ADD(a)", level: 2, op: "ADD", dtype: "f32"},
		{name: "ADD(b)", level: 2, op: "ADD", dtype: "f32"},
		{name: "ADD(f16)", level: 2, op: "ADD", dtype: "f16"},                     // not in the core set
		{name: "ADD(dtype=f32,a=[0,5],b=[5])", level: 2, op: "ADD", dtype: "f32"}, // zero-size: not in it either
		{name: "MATMUL(q4_0)", level: 2, op: "MATMUL", dtype: "f32/q4_0"},
		{name: "EXP(a)", level: 2, op: "EXP", dtype: "f32"}, // not in the core set
		{name: "BUFFER(import-host)", level: 3, op: "ADD", dtype: "f32"},
		{name: "BUFFER(import-fd)", level: 3, op: "ADD", dtype: "f32"},
		{name: "BUFFER(offset-binding,kv-append)", level: 3, op: "ADD", dtype: "f32"},
		{name: llmModelCase, level: 5, op: "MODEL"},
	}
}

func TestClaimLevels(t *testing.T) {
	pass := func(name string) CaseResult { return CaseResult{Name: name, Status: StatusPass} }
	with := func(name string, st Status, reason string) CaseResult {
		return CaseResult{Name: name, Status: st, Reason: reason}
	}
	all := func(except ...CaseResult) []CaseResult {
		var out []CaseResult
		for _, tc := range levelSuiteFixture() {
			r := pass(tc.name)
			for _, e := range except {
				if e.Name == tc.name {
					r = e
				}
			}
			if r.Status != "" {
				out = append(out, r)
			}
		}
		return out
	}
	drop := func(name string) CaseResult { return CaseResult{Name: name} } // not in the report
	tests := []struct {
		name    string
		cases   []CaseResult
		claimed map[string]bool
		reason  map[string]string // a level's reason must match
	}{
		{"everything passed", all(),
			map[string]bool{LevelABI: true, LevelLLMOps: true, LevelLLM: true, LevelHeterogeneous: true}, nil},
		{"cases outside every level do not count", all(with("ADD(f16)", StatusUnsupported, "no f16"), with("EXP(a)", StatusFail, ""),
			with("ADD(dtype=f32,a=[0,5],b=[5])", StatusUnsupported, "no empty tensors")),
			map[string]bool{LevelABI: true, LevelLLMOps: true, LevelLLM: true, LevelHeterogeneous: true}, nil},
		{"a synchronous device's unsupported ABI case", all(with("ABI(release-in-flight)", StatusUnsupported, "synchronous")),
			map[string]bool{LevelABI: true}, nil},
		{"an ABI case skipped", all(with("ABI(probe-info)", StatusSkipped, "isolated")),
			map[string]bool{LevelABI: false}, map[string]string{LevelABI: `^ABI\(probe-info\): skipped \(isolated\)$`}},
		{"an ABI case not run", all(drop("ABI(probe-info)")),
			map[string]bool{LevelABI: false}, map[string]string{LevelABI: `ABI\(probe-info\): not run`}},
		{"a core op unsupported, counted per op and dtype",
			all(with("ADD(a)", StatusUnsupported, "no ADD\nsecond line"), with("ADD(b)", StatusUnsupported, "no ADD")),
			map[string]bool{LevelLLMOps: false, LevelABI: true},
			map[string]string{LevelLLMOps: `^ADD f32: 2 unsupported, first ADD\(a\): unsupported \(no ADD\)$`}},
		{"a core op failed", all(CaseResult{Name: "MATMUL(q4_0)", Status: StatusFail, Category: CatMismatch}),
			map[string]bool{LevelLLMOps: false},
			map[string]string{LevelLLMOps: `MATMUL f32/q4_0: 1 fail, first MATMUL\(q4_0\): fail \(mismatch\)`}},
		{"the model case skipped", all(with(llmModelCase, StatusSkipped, "model absent")),
			map[string]bool{LevelLLM: false}, map[string]string{LevelLLM: `skipped \(model absent\)`}},
		{"one import kind is enough", all(with("BUFFER(import-host)", StatusUnsupported, "no host import")),
			map[string]bool{LevelHeterogeneous: true}, nil},
		{"no import at all", all(with("BUFFER(import-host)", StatusUnsupported, "no host import"), drop("BUFFER(import-fd)")),
			map[string]bool{LevelHeterogeneous: false},
			map[string]string{LevelHeterogeneous: `^none of BUFFER\(import-host\): unsupported \(no host import\); BUFFER\(import-fd\): not run$`}},
		{"offset bindings unsupported", all(with("BUFFER(offset-binding,kv-append)", StatusUnsupported, "no ADD")),
			map[string]bool{LevelHeterogeneous: false}, map[string]string{LevelHeterogeneous: `kv-append\): unsupported`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ls := claimLevels(levelSuiteFixture(), tt.cases)
			require.Len(t, ls, 4)
			byName := map[string]LevelResult{}
			for _, l := range ls {
				byName[l.Name] = l
				assert.NotEmpty(t, l.Reason, "%s has no reason", l.Name)
			}
			for name, want := range tt.claimed {
				assert.Equal(t, want, byName[name].Claimed, "%s: %s", name, byName[name].Reason)
			}
			for name, re := range tt.reason {
				assert.Regexp(t, re, byName[name].Reason, name)
			}
		})
	}
}

// A level whose case the suite lacks (no model case registered) is not claimed, and says so.
func TestClaimLevelsWithoutTheCase(t *testing.T) {
	ls := claimLevels([]testCase{{name: "ABI(probe-info)", level: 1}}, []CaseResult{{Name: "ABI(probe-info)", Status: StatusPass}})
	for _, l := range ls {
		if l.Name == LevelABI {
			assert.True(t, l.Claimed)
			continue
		}
		assert.False(t, l.Claimed, l.Name)
		assert.Equal(t, "the suite has no case of this level here", l.Reason)
	}
}

// Run puts the levels into the report and every format: the test plugin passes the ABI and
// buffer cases (the filter leaves the op cases out, so the core set is not run).
func TestReportLevels(t *testing.T) {
	plugins := buildMutants(t, "")
	rep := runPlugin(t, plugins[""], WithFilter(regexp.MustCompile(`^(ABI|BUFFER)\(`)))
	require.Len(t, rep.Levels, 4)
	got := map[string]LevelResult{}
	for _, l := range rep.Levels {
		got[l.Name] = l
	}
	assert.True(t, got[LevelABI].Claimed, got[LevelABI].Reason)
	assert.True(t, got[LevelHeterogeneous].Claimed, got[LevelHeterogeneous].Reason)
	assert.False(t, got[LevelLLMOps].Claimed)
	assert.Contains(t, got[LevelLLMOps].Reason, "not run")

	var md bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&md))
	assert.Contains(t, md.String(), "## Levels")
	assert.Contains(t, md.String(), "| ABI | ✓ claimed |")
	assert.Contains(t, md.String(), "| ops: LLM core set | ✗ not claimed |")

	var xb bytes.Buffer
	require.NoError(t, rep.WriteJUnit(&xb))
	var suites junitSuites
	require.NoError(t, xml.Unmarshal(xb.Bytes(), &suites))
	require.Len(t, suites.Suites, 2)
	ls := suites.Suites[1]
	assert.Equal(t, 4, ls.Tests)
	assert.Equal(t, 2, ls.Skipped, "the two levels not claimed are skipped")
	assert.Zero(t, ls.Failures, "not claiming a level is no failure")
}

// The LLM core level keeps its op set 4 meaning: the soft-cap and sliding-window attention
// cases of op set 5 are in the suite but not in the level.
func TestLevelLLMOpsLeavesOutOpSet5(t *testing.T) {
	var member func(testCase) bool
	for _, l := range levelDefs() {
		if l.name == LevelLLMOps {
			member = l.member
		}
	}
	require.NotNil(t, member)
	v5, inLevel := 0, 0
	for _, tc := range allCases() {
		if tc.v5 {
			v5++
			require.False(t, member(tc), tc.name)
		}
		if member(tc) && tc.op == "ATTENTION" {
			inLevel++
		}
	}
	require.Positive(t, v5)
	require.Positive(t, inLevel)
}
