package coresel

import (
	"math"
	"os"
	"testing"
)

// FuzzParseSoC: any description ParseSoC accepts gives a topology and finite, positive
// predictions for every selection of it.
func FuzzParseSoC(f *testing.F) {
	for _, name := range SoCNames() {
		b, err := os.ReadFile("../soc/socs/" + name + ".json")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"name":"x","cpu":{"clusters":[]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSoC(b)
		if err != nil {
			return
		}
		top, err := s.Topology()
		if err != nil {
			return
		}
		if top.SpaceSize() > 2000 {
			return // huge core counts: valid, but too slow to enumerate here
		}
		for _, sel := range top.Exhaustive() {
			tps, w, err := s.Predict(top, sel)
			if err != nil {
				t.Fatalf("%s: %v", sel.Key(), err)
			}
			if !(tps > 0) || math.IsInf(tps, 0) || !(w >= 0) || math.IsInf(w, 0) {
				t.Fatalf("%s: %g tok/s, %g W", sel.Key(), tps, w)
			}
		}
	})
}
