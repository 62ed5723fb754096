package sched

import (
	"errors"
	"testing"

	"github.com/xpuhub/xpu/core"
)

// FuzzParseUnitSpec: any text either fails with ErrBadUnitSpec or gives a spec whose canonical
// form reads back as the same spec; a unit list's specs do too.
func FuzzParseUnitSpec(f *testing.F) {
	for _, s := range []string{"neon", "qnn:1", "neon{cpus=0,1,threads=2}", "neon:0{cpus=0;threads=1}",
		"opencl{}", "neon{", "a{b{c}}", ":0", "neon{,x}", "neon{cpus=0},neon{cpus=1},opencl"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		check := func(u UnitSpec) {
			again, err := ParseUnitSpec(u.String())
			if err != nil {
				t.Fatalf("%q: canonical form %q does not parse: %v", s, u.String(), err)
			}
			if again.String() != u.String() || again.Backend != u.Backend || again.Index != u.Index ||
				len(again.Options) != len(u.Options) {
				t.Fatalf("%q: %q reads back as %q", s, u.String(), again.String())
			}
		}
		u, err := ParseUnitSpec(s)
		if err != nil {
			if !errors.Is(err, ErrBadUnitSpec) || !errors.Is(err, core.ErrInvalidArgument) {
				t.Fatalf("%q: error %v does not wrap ErrBadUnitSpec", s, err)
			}
		} else {
			check(u)
		}
		list, err := ParseUnitList(s)
		if err != nil {
			if !errors.Is(err, ErrBadUnitSpec) {
				t.Fatalf("%q: list error %v does not wrap ErrBadUnitSpec", s, err)
			}
			return
		}
		for _, u := range list {
			check(u)
		}
	})
}
