package conformance

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// provenanceReport is a report as Run fills it, with one failure whose text needs escaping.
func provenanceReport() *Report {
	nmse := 0.5
	r := &Report{
		Backend: BackendRecord{Name: "mine", Vendor: "ACME", Version: "2.1", BuildID: "mine-2.1-abc"},
		Device:  DeviceRecord{Kind: "npu", Name: "ACME NPU", Vendor: "ACME"},
		Seed:    7, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Provenance: Provenance{XPUVersion: "v1.2.3", XPUCommit: "0123abcd", GoVersion: "go1.26", SuiteVersion: SuiteVersion,
			ABIVersion: "1.0", OpSetVersion: 4, PluginABIVersion: "1.0", PluginOpSets: "1-4",
			Machine: Machine{OS: "linux", Arch: "arm64", CPU: "Cortex-X4", Cores: 8}},
	}
	r.add(CaseResult{Name: "MATMUL(q4_0,1x64x64)", Level: 2, Op: "MATMUL", DType: "f32/q4_0", Status: StatusPass})
	r.add(CaseResult{Name: "ADD(f32,<tail>)", Level: 2, Op: "ADD", DType: "f32", Status: StatusFail, Category: CatMismatch,
		Errors: []string{"nmse 0.5 > 1e-6 for a<b & c"}, NMSE: &nmse, Repro: "xpu conform --plugin mine --filter 'ADD'"})
	r.add(CaseResult{Name: "CAST(f32>bf16)", Level: 2, Op: "CAST", DType: "f32>bf16", Status: StatusUnsupported, Reason: "no bf16"})
	return r
}

// Every format carries the provenance a vendor publishes with a report: the xpu version and
// commit, the suite, ABI and op-set versions, the plugin's build id, the machine, the date and
// the seed.
func TestReportProvenanceInEveryFormat(t *testing.T) {
	r := provenanceReport()
	want := []string{"v1.2.3", "0123abcd", "suite " + SuiteVersion, "ABI 1.0", "op set 4", "mine-2.1-abc",
		"Cortex-X4, 8 cores, linux/arm64", "2026-01-02 03:04 UTC", "seed 7"}
	var md, page bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&md))
	require.NoError(t, r.WriteHTML(&page))
	for _, s := range want {
		assert.Contains(t, md.String(), s, "markdown")
		assert.Contains(t, page.String(), s, "html")
	}

	var js bytes.Buffer
	require.NoError(t, r.WriteJSON(&js))
	var back Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, r.Provenance, back.Provenance)
	assert.Equal(t, r.Backend.BuildID, back.Backend.BuildID)
	assert.Equal(t, r.Seed, back.Seed)

	var ju bytes.Buffer
	require.NoError(t, r.WriteJUnit(&ju))
	var suites junitSuites
	require.NoError(t, xml.Unmarshal(ju.Bytes(), &suites))
	require.Len(t, suites.Suites, 1)
	props := map[string]string{}
	for _, p := range suites.Suites[0].Properties {
		props[p.Name] = p.Value
	}
	for k, v := range map[string]string{"xpu.version": "v1.2.3", "xpu.commit": "0123abcd", "suite.version": SuiteVersion,
		"abi.version": "1.0", "opset.version": "4", "plugin.build_id": "mine-2.1-abc", "plugin.op_sets": "1-4",
		"machine": "Cortex-X4, 8 cores, linux/arm64", "date": "2026-01-02T03:04:05Z", "seed": "7"} {
		assert.Equal(t, v, props[k], k)
	}
}

// The HTML page is one file a browser opens offline: no script, no external reference, the
// summary first, the Markdown's tables as tables, and every piece of case text escaped.
func TestReportHTML(t *testing.T) {
	var page bytes.Buffer
	require.NoError(t, provenanceReport().WriteHTML(&page))
	s := page.String()
	assert.True(t, strings.HasPrefix(s, "<!DOCTYPE html>"))
	for _, bad := range []string{"<script", "http://", "https://", "src=", "<link"} {
		assert.NotContains(t, s, bad)
	}
	assert.Contains(t, s, `<div class="summary bad">1 passed, 1 failed, 1 unsupported</div>`)
	assert.Contains(t, s, "<th>op</th><th>f32</th>")
	assert.Contains(t, s, "<td>MATMUL</td>")
	assert.Contains(t, s, "<code>ADD(f32,&lt;tail&gt;)</code>", "case names escaped inside code spans")
	assert.Contains(t, s, "a&lt;b &amp; c", "error text escaped")
	assert.NotContains(t, s, "<tail>")
	assert.Equal(t, strings.Count(s, "<table>"), strings.Count(s, "</table>"))
	assert.Equal(t, strings.Count(s, "<ul>"), strings.Count(s, "</ul>"))
}

func TestMarkdownHTMLSubset(t *testing.T) {
	tests := []struct{ md, want string }{
		{"# Title `x`", "<h1>Title <code>x</code></h1>\n"},
		{"- a\n- **b**", "<ul>\n<li>a</li>\n<li><strong>b</strong></li>\n</ul>\n"},
		{"| h | `a\\|b` |\n|---|---|\n| 1 | 2 |", "<table>\n<thead><tr><th>h</th><th><code>a|b</code></th></tr></thead>\n<tbody>\n<tr><td>1</td><td>2</td></tr>\n</tbody>\n</table>\n"},
		{"one\ntwo\n\nthree", "<p>one two</p>\n<p>three</p>\n"},
		{"#not a heading", "<p>#not a heading</p>\n"},
		{"<b>x</b>", "<p>&lt;b&gt;x&lt;/b&gt;</p>\n"},
	}
	for _, tt := range tests {
		var b strings.Builder
		markdownHTML(&b, tt.md)
		assert.Equal(t, tt.want, b.String(), tt.md)
	}
}
