package spec

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSpecPolicy drives the verify-length policy with made-up costs and outcomes.
func TestSpecPolicy(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	cases := []struct {
		name string
		run  func(t *testing.T, p *Policy)
	}{
		{"decodes twice before the first verify", func(t *testing.T, p *Policy) {
			k, l := p.Choose(7, 9)
			assert.Equal(t, [2]int{0, 1}, [2]int{k, l}, "no decode measured")
			p.Observe(1, ms(5), 0, 0, 0)
			k, l = p.Choose(7, 9)
			assert.Equal(t, [2]int{0, 1}, [2]int{k, l}, "only the cold first decode measured")
			p.Observe(1, ms(1), 0, 0, 0)
			k, l = p.Choose(7, 9)
			assert.Equal(t, [2]int{7, 8}, [2]int{k, l}, "with the prior, a draft of 7 pays at guessed cost 1.5 decodes")
		}},
		{"a cold or slowed pass does not set the cost", func(t *testing.T, p *Policy) {
			p.Observe(1, ms(0.5), 0, 0, 0)
			assert.NotContains(t, p.cost, 1, "the first pass is not timed")
			p.Observe(1, ms(2), 0, 0, 0)
			p.Observe(1, ms(1), 0, 0, 0)
			assert.InDelta(t, 0.001, p.cost[1], 1e-9, "a faster pass is taken at once")
			p.Observe(1, ms(5), 0, 0, 0)
			assert.InDelta(t, 0.0012, p.cost[1], 1e-9, "a slower one moves it by 5% of the difference")
			p.Observe(8, ms(30), 7, 7, 9)
			assert.NotContains(t, p.cost, 8, "nor is a verify length's first pass")
			assert.InDelta(t, 1, p.hit[0][0], 1e-9, "its acceptance counts")
		}},
		{"acceptance is kept per match length", func(t *testing.T, p *Policy) {
			p.Observe(1, ms(1), 0, 0, 0)
			p.Observe(1, ms(1), 0, 0, 0)
			for range 30 {
				p.Observe(8, ms(1.6), 7, 0, 1) // one-token matches: rejected at once
				p.Observe(8, ms(1.6), 7, 7, 9) // long matches: all accepted
			}
			k, _ := p.Choose(7, 1)
			assert.Equal(t, 0, k, "a one-token match is decoded plainly")
			k, l := p.Choose(7, 12)
			assert.Equal(t, [2]int{7, 8}, [2]int{k, l}, "a long match is verified")
			// a match length never seen goes by its prior, not by the pool (half of the
			// drafts fully accepted)
			assert.InDelta(t, 1+0.6+0.36+0.216+0.1296+0.07776+0.046656+0.0279936, p.expected(7, matchBucket(3)), 1e-9)
			assert.NotEqual(t, p.expected(7, 0), p.expected(7, matchBucket(3)))
		}},
		{"long matches are verified although short ones fail", func(t *testing.T, p *Policy) {
			p.Observe(1, ms(1), 0, 0, 0)
			p.Observe(1, ms(1), 0, 0, 0)
			for range 10 {
				p.Observe(8, ms(1.6), 7, 0, 0)
				p.Observe(8, ms(1.6), 7, 0, 1)
			}
			k, _ := p.Choose(7, 1)
			assert.Equal(t, 0, k, "a one-token match is decoded plainly")
			k, l := p.Choose(7, 6)
			assert.Equal(t, [2]int{7, 8}, [2]int{k, l}, "a first long match is verified on its prior")
		}},
		{"one slow early verify does not rule its length out", func(t *testing.T, p *Policy) {
			p.Observe(1, ms(1), 0, 0, 0)
			p.Observe(1, ms(1), 0, 0, 0)
			p.Observe(8, ms(1.6), 7, 7, 12) // untimed
			p.Observe(8, ms(5), 7, 7, 12)   // slowed by something else: 5 decodes
			assert.InDelta(t, 5, p.cost[8], 1e-9, "kept in decode passes")
			assert.InDelta(t, 1.5, p.ratio(8), 1e-9, "no dearer than the guess while barely timed")
			k, l := p.Choose(7, 12)
			assert.Equal(t, [2]int{7, 8}, [2]int{k, l}, "so it is run again")
			p.Observe(8, ms(5), 7, 7, 12)
			p.Observe(8, ms(5), 7, 7, 12)
			assert.InDelta(t, 5, p.ratio(8), 1e-9, "three timed passes: the measurement stands")
		}},
		{"a verify's cost follows decoding's speed", func(t *testing.T, p *Policy) {
			p.Observe(1, ms(2), 0, 0, 0)
			p.Observe(1, ms(2), 0, 0, 0) // a cold start: decoding at 2 ms
			for range 4 {
				p.Observe(8, ms(3), 7, 7, 12) // 1.5 decodes
			}
			for range 20 {
				p.Observe(1, ms(1), 0, 0, 0) // warmed up
			}
			assert.InDelta(t, 1.5, p.ratio(8), 1e-9)
			assert.InDelta(t, 0.001, p.cost[1], 1e-9)
			// in seconds the verify now costs 1.5 ms, not the 3 ms it was timed at
			assert.InDelta(t, 0.0015, p.ratio(8)*p.cost[1], 1e-9)
		}},
		{"always verifies the shortest length that holds the draft", func(t *testing.T, p *Policy) {
			p.always = true
			k, l := p.Choose(9, 0)
			assert.Equal(t, [2]int{9, 16}, [2]int{k, l})
			k, l = p.Choose(40, 0)
			assert.Equal(t, [2]int{31, 32}, [2]int{k, l})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, NewPolicy([]int{8, 16, 32}, false)) })
	}
}

func TestMatchBucket(t *testing.T) {
	for _, c := range []struct{ m, b int }{{-1, 1}, {0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 4}, {5, 5}, {8, 5}, {9, 6}, {15, 6}, {16, 7}, {100, 7}} {
		assert.Equal(t, c.b, matchBucket(c.m), "match %d", c.m)
	}
}
