package coresel

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/xpuhub/xpu/sched/cputopo"
)

// SimTrial is a simulated trial: the SoC description's predicted speed and power, with
// multiplicative Gaussian noise (MNN-AECS saw up to 5 % run to run). Its measurements are
// Modelled and its meter says "simulated".
type SimTrial struct {
	SoC       *SoC
	Top       *cputopo.Topology
	Tokens    int
	EnergySD  float64 // relative standard deviation of energy (default 0.03: ±5 % at ~1.6σ)
	SpeedSD   float64 // of speed (default 0.01)
	rng       *rand.Rand
	Noiseless bool
}

// NewSimTrial simulates trials of tokens decode tokens on soc, seeded.
func NewSimTrial(soc *SoC, seed uint64, tokens int) (*SimTrial, error) {
	top, err := soc.Topology()
	if err != nil {
		return nil, err
	}
	return &SimTrial{SoC: soc, Top: top, Tokens: tokens, EnergySD: 0.03, SpeedSD: 0.01,
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, nil
}

// Measure implements Trial.
func (s *SimTrial) Measure(ctx context.Context, sel cputopo.Selection) (Measurement, error) {
	if err := ctx.Err(); err != nil {
		return Measurement{}, err
	}
	tps, w, err := s.SoC.Predict(s.Top, sel)
	if err != nil {
		return Measurement{}, err
	}
	j := w / tps
	if !s.Noiseless {
		tps *= 1 + s.SpeedSD*s.rng.NormFloat64()
		j *= 1 + s.EnergySD*s.rng.NormFloat64()
	}
	return Measurement{TokPerSec: tps, JoulesPerToken: j, Modelled: true, Tokens: s.Tokens,
		Meter: fmt.Sprintf("model:soc %s (simulated)", s.SoC.Name)}, nil
}

// Meter names the simulated meter.
func (s *SimTrial) Meter() string { return fmt.Sprintf("model:soc %s (simulated)", s.SoC.Name) }
