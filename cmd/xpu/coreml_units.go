package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/xpuhub/xpu/plugins/coreml"
)

// coremlUnitsFlag adds --coreml-units to fs. The returned apply validates the value and hands
// it to the coreml backend (coreml.EnvUnits, read when the backend opens); call it after parsing.
func coremlUnitsFlag(fs *flag.FlagSet) (apply func() error) {
	u := fs.String("coreml-units", "", "Core ML compute units for the coreml backend: "+strings.Join(coreml.Units, "|")+" (default all)")
	return func() error {
		if *u == "" {
			return nil
		}
		if !slices.Contains(coreml.Units, *u) {
			return fmt.Errorf("--coreml-units %q: want one of %s", *u, strings.Join(coreml.Units, ", "))
		}
		return os.Setenv(coreml.EnvUnits, *u)
	}
}
