package llm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/xpuhub/xpu/llm/draft"
	"github.com/xpuhub/xpu/loader"
)

// BenchmarkVerifyPass times one pass of each graph length at cache positions 64 and 480 (the
// second is where bench/spec.sh's summary task decodes: a 433-token prompt, 200 tokens):
// decode (1) and the verify lengths, on the stories260K model and neon, 1 thread; cpu-ns/op is
// the process's CPU time per pass:
//
//	go test ./llm -run X -bench VerifyPass
func BenchmarkVerifyPass(b *testing.B) {
	m := openStories(b)
	name := "neon"
	be, err := loader.Open(context.Background(), name)
	if err != nil {
		b.Skipf("backend %s: %v", name, err)
	}
	b.Cleanup(func() { be.Close() })
	r, err := NewRunner(context.Background(), m, be.Devices()[0], WithVerifyLengths(2, 4, 8, 16, 32), WithContextLength(1024),
		WithContextOptions(map[string]string{"threads": "1"}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ctx := context.Background()
	for _, pos := range []int{64, 480} {
		prompt := make([]int32, pos)
		for i := range prompt {
			prompt[i] = int32(i%500 + 10)
		}
		for _, l := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("pos=%d/len=%d", pos, l), func(b *testing.B) {
				r.Reset()
				if _, err := r.Prefill(ctx, prompt); err != nil {
					b.Fatal(err)
				}
				cpu0 := cpuTime()
				for b.Loop() {
					if _, err := r.Verify(ctx, prompt[:l]); err != nil {
						b.Fatal(err)
					}
					if err := r.Truncate(pos); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkSpecSummary is bench/spec.sh's summary task in process (the story twice as the
// prompt, 200 greedy tokens, stories260K on neon, 1 thread): plain decoding, the default policy
// (retrieval drafts, verified where they pay) with several sets of verify lengths, and retrieval
// verifying every draft. Every iteration runs each configuration once, in a rotating order (so
// that a change in the machine's load falls on all of them alike), generating 200 tokens and
// then 1 (the prefill and calibration, which the difference cancels). cpu-us/tok:NAME is the
// process's CPU time of decoding per token, which the load moves far less than the wall clock
// (the policy's choices still follow the wall clock); x-plain:NAME is plain decoding's CPU time
// over the configuration's, i.e. its speed-up; tok/pass:NAME the tokens per forward pass.
// Garbage collection is left out: each run starts after a collection.
//
//	go test ./llm -run X -bench SpecSummary -benchtime 10x
func BenchmarkSpecSummary(b *testing.B) {
	m := openStories(b)
	story, err := os.ReadFile(filepath.Join(modelsDir(b), "stories260K.greedy.txt"))
	if err != nil {
		b.Fatal(err)
	}
	s := strings.ReplaceAll(string(story[:500]), "\n", " ")
	prompt := s + " " + s
	dev := pluginDevices(b, "neon")[0]
	ctx := context.Background()
	type config struct {
		name    string
		lengths []int // nil: plain decoding
		always  bool
		r       *Runner
		cpu     time.Duration
		tokens  int
		passes  int
		st      SpecStats // summed: the wall-clock split and the verify lengths
	}
	cs := []*config{
		{name: "plain"},
		{name: "auto-8,16,32", lengths: []int{8, 16, 32}},
		{name: "auto-4,8,16,32", lengths: []int{4, 8, 16, 32}}, // the default
		{name: "auto-2,4,8,16,32", lengths: []int{2, 4, 8, 16, 32}},
		{name: "always-8,16,32", lengths: []int{8, 16, 32}, always: true},
	}
	for _, c := range cs {
		ro := []RunnerOption{WithContextOptions(map[string]string{"threads": "1"})}
		if c.lengths != nil {
			ro = append(ro, WithVerifyLengths(c.lengths...))
		}
		if c.r, err = NewRunner(ctx, m, dev, ro...); err != nil {
			b.Fatal(err)
		}
		defer c.r.Close()
	}
	gen := func(c *config, n int) (Result, time.Duration) {
		opts := []GenerateOption{WithMaxTokens(n)}
		if c.lengths != nil {
			var so []SpecOption
			if c.always {
				so = append(so, SpecAlways())
			}
			opts = append(opts, WithSpeculative(draft.NewRetrieval(draft.RetrievalOptions{}), so...))
		}
		runtime.GC()
		t0 := cpuTime()
		res, err := c.r.Generate(ctx, prompt, opts...)
		if err != nil {
			b.Fatal(err)
		}
		return res, cpuTime() - t0
	}
	var want string
	round := 0
	for b.Loop() {
		for i := range cs {
			c := cs[(i+round)%len(cs)]
			res, full := gen(c, 200)
			_, one := gen(c, 1)
			if want == "" {
				want = res.Text
			} else if res.Text != want {
				b.Fatalf("%s: the text differs from the other configurations'", c.name)
			}
			c.cpu += full - one
			c.tokens += len(res.Tokens) - 1
			if sp := res.Spec; sp != nil {
				c.passes += sp.Passes
				c.st.Verifies += sp.Verifies
				c.st.Plain += sp.Plain
				c.st.Verify += sp.Verify
				c.st.Decode += sp.Decode
				c.st.Draft += sp.Draft
				c.st.Overhead += sp.Overhead
			}
		}
		round++
	}
	plain := float64(cs[0].cpu) / float64(cs[0].tokens)
	for _, c := range cs {
		per := float64(c.cpu) / float64(c.tokens)
		b.ReportMetric(per/1e3, "cpu-us/tok:"+c.name)
		if c.lengths != nil {
			b.ReportMetric(plain/per, "x-plain:"+c.name)
			b.ReportMetric(float64(c.tokens)/float64(c.passes), "tok/pass:"+c.name)
			// wall clock per pass, as the policy sees it
			if c.st.Verifies > 0 {
				b.ReportMetric(float64(c.st.Verify.Microseconds())/float64(c.st.Verifies), "wall-us/verify:"+c.name)
			}
			if c.st.Plain > 0 {
				b.ReportMetric(float64(c.st.Decode.Microseconds())/float64(c.st.Plain), "wall-us/decode:"+c.name)
			}
			b.ReportMetric(float64(c.st.Verifies)/float64(c.passes), "verify-share:"+c.name)
			b.ReportMetric(float64((c.st.Draft+c.st.Overhead).Microseconds())/float64(c.tokens), "wall-us/tok-draft+overhead:"+c.name)
		}
	}
}
