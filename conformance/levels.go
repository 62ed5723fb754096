package conformance

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The levels a vendor can claim, each a named subset of the suite (docs/writing-a-backend.md,
// "Conformance levels"). A level is claimed when every case of its subset ran and passed
// (level ABI also accepts a case that is unsupported by the device's own claims, such as
// release-in-flight on a synchronous device); otherwise the report says why not.
const (
	// LevelABI: every ABI and lifecycle case (level 1).
	LevelABI = "ABI"
	// LevelLLMOps: the op cases of the ops and dtypes a llama or qwen decode runs (LLMCoreOps).
	LevelLLMOps = "ops: LLM core set"
	// LevelLLM: the stories260K model case, whose greedy text must equal the published sample.
	LevelLLM = "LLM"
	// LevelHeterogeneous: what running as a unit beside another backend takes: the runtime's
	// arena imported without a copy (by host pointer, or by fd when isolated), tensors bound
	// at offsets inside it, and fences between submissions.
	LevelHeterogeneous = "heterogeneous"
)

// LLMCoreOps are the op cases of LevelLLMOps: op name → the case dtype labels (activation, or
// activation/weight) a llama or qwen decode needs; cases of a zero-size tensor are left out. They are the ops llm's graph builder emits
// for those families (the placement report of `xpu run --stats` lists them) with f32
// activations, the runner's default f32 KV cache, and the weight dtypes of f32, f16, Q8_0 and
// Q4_0 GGUF files.
var LLMCoreOps = map[string][]string{
	"GET_ROWS":  {"f32", "f16", "q8_0", "q4_0"},
	"RMS_NORM":  {"f32"},
	"MATMUL":    {"f32/f32", "f32/f16", "f32/q8_0", "f32/q4_0"},
	"ROPE":      {"f32"},
	"ATTENTION": {"f32/f32"},
	"MUL":       {"f32"},
	"ADD":       {"f32"},
	"SILU":      {"f32"},
	"RESHAPE":   {"f32"},
}

// llmModelCase is the model case LevelLLM rests on (registered by llm/llmconform).
const llmModelCase = "MODEL(stories260K-greedy)"

// LevelResult says whether a report supports claiming one level.
type LevelResult struct {
	Name    string `json:"name"`
	Claimed bool   `json:"claimed"`
	// Reason: what is missing when not claimed, what the claim rests on when claimed.
	Reason string `json:"reason"`
}

// levelDef is one level: the cases it takes (by name, among those the suite has) and the
// rule that judges them.
type levelDef struct {
	name    string
	what    string // what the claim rests on, for a claimed level's reason
	member  func(testCase) bool
	okUnsup bool // an unsupported case does not stand in the way (level 1's capability-gated cases)
	// anyOf: groups of case names of which one passing case is enough (the two kinds of import)
	anyOf [][]string
}

// zeroSized matches a case name with a dimension of 0 in a shape list ("a=[0,5]", "ids=[0]").
var zeroSized = regexp.MustCompile(`[\[,]0[\],]`)

func levelDefs() []levelDef {
	core := func(tc testCase) bool {
		// a decode never builds an empty tensor, and some devices cannot (QNN, Core ML): those
		// cases stay in the suite, but the claim does not rest on them
		// the level predates op set 5: a llama or qwen decode uses neither soft-cap nor window
		if zeroSized.MatchString(tc.name) || tc.v5 {
			return false
		}
		for _, dt := range LLMCoreOps[tc.op] {
			if tc.level == 2 && tc.dtype == dt {
				return true
			}
		}
		return false
	}
	return []levelDef{
		{name: LevelABI, what: "every ABI and lifecycle case passed", okUnsup: true,
			member: func(tc testCase) bool { return tc.level == 1 }},
		{name: LevelLLMOps, what: "every case of the LLM core ops and dtypes passed", member: core},
		{name: LevelLLM, what: "stories260K's greedy text equals the published sample",
			member: func(tc testCase) bool { return tc.name == llmModelCase }},
		{name: LevelHeterogeneous, what: "zero-copy import, offset bindings and fences passed",
			member: func(tc testCase) bool {
				return tc.name == "ABI(fences-and-submit)" || tc.name == "BUFFER(offset-binding,kv-append)"
			},
			anyOf: [][]string{{"BUFFER(import-host)", "BUFFER(import-fd)"}}},
	}
}

// ClaimLevels judges a report's cases against every level, in the order of the constants.
func ClaimLevels(cases []CaseResult) []LevelResult { return claimLevels(allCases(), cases) }

// claimLevels judges cases, the results of a run of suite.
func claimLevels(suite []testCase, cases []CaseResult) []LevelResult {
	byName := make(map[string]CaseResult, len(cases))
	for _, c := range cases {
		byName[c.Name] = c
	}
	var out []LevelResult
	for _, l := range levelDefs() {
		var problems []string
		// an op's cases are many (shapes): their problems are counted per op and dtype
		opProblems := map[string]*opProblem{}
		members := 0
		for _, tc := range suite {
			if !l.member(tc) {
				continue
			}
			members++
			c, ran := byName[tc.name]
			if ran && (c.Status == StatusPass || c.Status == StatusUnsupported && l.okUnsup) {
				continue
			}
			if tc.level != 2 {
				if ran {
					problems = append(problems, caseProblem(c))
				} else {
					problems = append(problems, tc.name+": not run")
				}
				continue
			}
			key := tc.op + " " + tc.dtype
			op := opProblems[key]
			if op == nil {
				op = &opProblem{counts: map[Status]int{}}
				opProblems[key] = op
				problems = append(problems, key) // replaced by the count below
			}
			if !ran {
				op.counts["not run"]++
			} else {
				op.counts[c.Status]++
				if op.first == "" {
					op.first = caseProblem(c)
				}
			}
		}
		for i, p := range problems {
			if op := opProblems[p]; op != nil {
				problems[i] = op.String(p)
			}
		}
		for _, group := range l.anyOf {
			if !slices.ContainsFunc(suite, func(tc testCase) bool { return slices.Contains(group, tc.name) }) {
				continue // a suite without these cases (a test's) has no such requirement
			}
			members++
			var tried []string
			ok := false
			for _, name := range group {
				c, ran := byName[name]
				if ran && c.Status == StatusPass {
					ok = true
					break
				}
				if ran {
					tried = append(tried, caseProblem(c))
				} else {
					tried = append(tried, name+": not run")
				}
			}
			if !ok {
				problems = append(problems, "none of "+strings.Join(tried, "; "))
			}
		}
		res := LevelResult{Name: l.name, Claimed: members > 0 && len(problems) == 0}
		switch {
		case members == 0:
			res.Reason = "the suite has no case of this level here"
		case res.Claimed:
			res.Reason = l.what
		default:
			res.Reason = summarizeProblems(problems)
		}
		out = append(out, res)
	}
	return out
}

// opProblem counts the cases of one op and dtype that stand in the way of a claim.
type opProblem struct {
	counts map[Status]int
	first  string // the first such case that ran, with its reason
}

func (o *opProblem) String(key string) string {
	var parts []string
	for _, st := range []Status{StatusFail, StatusUnsupported, StatusSkipped, "not run"} {
		if n := o.counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	s := key + ": " + strings.Join(parts, ", ")
	if o.first != "" {
		s += ", first " + o.first
	}
	return s
}

// caseProblem is one case that stands in the way of a claim: its name, status and why.
func caseProblem(c CaseResult) string {
	s := c.Name + ": " + string(c.Status)
	switch {
	case c.Status == StatusFail && c.Category != CatNone:
		s += " (" + string(c.Category) + ")"
	case c.Reason != "":
		// a reason can be a list of refused nodes: its first line says enough
		r, _, _ := strings.Cut(c.Reason, "\n")
		s += " (" + r + ")"
	}
	return s
}

// summarizeProblems keeps a reason short: the first three problems and how many more there are.
func summarizeProblems(ps []string) string {
	const show = 3
	if len(ps) <= show {
		return strings.Join(ps, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(ps[:show], "; "), len(ps)-show)
}

// String is the level as one line: "ABI: claimed (why)" or "LLM: not claimed: why".
func (l LevelResult) String() string {
	if l.Claimed {
		return fmt.Sprintf("%s: claimed (%s)", l.Name, l.Reason)
	}
	return fmt.Sprintf("%s: not claimed: %s", l.Name, l.Reason)
}

// writeLevelsMarkdown is the report's "Levels" section.
func writeLevelsMarkdown(b *strings.Builder, ls []LevelResult) {
	if len(ls) == 0 {
		return
	}
	b.WriteString("\n\n## Levels\n\n| level | claimed | why |\n|---|---|---|\n")
	for _, l := range ls {
		mark := "✗ not claimed"
		if l.Claimed {
			mark = "✓ claimed"
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", l.Name, mark, strings.ReplaceAll(strings.ReplaceAll(l.Reason, "|", `\|`), "\n", " "))
	}
}

// levelSuite is the levels as a JUnit suite: a claimed level passes, one not claimed is
// skipped with its reason (not claiming a level is no failure; a failed case already is one).
func levelSuite(base string, ls []LevelResult) junitSuite {
	s := junitSuite{Name: "xpu-conformance-levels." + base, Tests: len(ls)}
	for _, l := range ls {
		jc := junitCase{Class: "conformance.levels", Name: l.Name}
		if !l.Claimed {
			s.Skipped++
			jc.Skipped = &junitSkipped{Message: "not claimed: " + l.Reason}
		}
		s.Cases = append(s.Cases, jc)
	}
	return s
}
