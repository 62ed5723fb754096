package spec

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Stats reports a speculative generation.
type Stats struct {
	// Passes is the forward passes of decoding: Verifies plus Plain (one-token decodes).
	Passes, Verifies, Plain int
	// Drafted and Accepted count draft tokens verified and kept.
	Drafted, Accepted int
	// Histogram[a] counts the verify passes that kept a draft tokens.
	Histogram []int
	// Lengths counts the verify passes per verify graph length.
	Lengths map[int]int
	// Time split of decoding: proposing drafts, verify passes, one-token decodes, and the
	// rest (acceptance, sampling, streaming); Calibrate is the prefill's calibration.
	Draft, Verify, Decode, Overhead, Calibrate time.Duration
	// Fallback says why drafting was turned off during the generation, if it was.
	Fallback string
}

// TokensPerPass is the tokens produced per forward pass of decoding (1 for plain decoding).
func (s *Stats) TokensPerPass() float64 {
	if s.Passes == 0 {
		return 0
	}
	return float64(s.Passes+s.Accepted) / float64(s.Passes)
}

// AcceptanceRate is the share of verified draft tokens kept.
func (s *Stats) AcceptanceRate() float64 {
	if s.Drafted == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Drafted)
}

// String is a few lines for --stats: tokens per pass, the acceptance histogram and the time
// split.
func (s *Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "speculative: %.2f tokens/pass over %d passes (%d verify, %d plain); %d of %d draft tokens accepted (%.0f%%)\n",
		s.TokensPerPass(), s.Passes, s.Verifies, s.Plain, s.Accepted, s.Drafted, 100*s.AcceptanceRate())
	if len(s.Lengths) > 0 {
		ls := make([]int, 0, len(s.Lengths))
		for l := range s.Lengths {
			ls = append(ls, l)
		}
		slices.Sort(ls)
		b.WriteString("verify lengths:")
		for _, l := range ls {
			fmt.Fprintf(&b, " %d×%d", l, s.Lengths[l])
		}
		b.WriteString("\n")
	}
	if len(s.Histogram) > 0 {
		b.WriteString("accepted per verify:")
		for a, n := range s.Histogram {
			if n > 0 {
				fmt.Fprintf(&b, " %d:%d", a, n)
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "time: draft %v, verify %v, plain decode %v, overhead %v, calibrate %v\n",
		s.Draft.Round(time.Microsecond), s.Verify.Round(time.Microsecond), s.Decode.Round(time.Microsecond),
		s.Overhead.Round(time.Microsecond), s.Calibrate.Round(time.Microsecond))
	if s.Fallback != "" {
		fmt.Fprintf(&b, "fallback: %s\n", s.Fallback)
	}
	return b.String()
}
