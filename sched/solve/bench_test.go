package solve_test

import (
	"testing"

	"github.com/xpuhub/xpu/sched/soc"
	"github.com/xpuhub/xpu/sched/solve"
)

// BenchmarkSolve is one tensor-level solve (prefill over six chunk lengths, decode) of each
// shipped model on the simulated SD8 Gen 3: what `xpu plan --soc` costs per configuration.
func BenchmarkSolve(b *testing.B) {
	s, err := soc.Load("sd8gen3")
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range soc.ModelNames() {
		m, err := soc.Model(name)
		if err != nil {
			b.Fatal(err)
		}
		p, err := s.Profile(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := solve.Solve(p, solve.Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
