package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/xpuhub/xpu/core"
)

// backendSettingFlags adds a flag --NAME-KEY to fs for each setting of each built-in backend
// (core.BuiltIn.Settings: Core ML's --coreml-units). The returned apply hands the values given
// to the backends (core.SetBackendSetting, which validates them); call it after parsing.
func backendSettingFlags(fs *flag.FlagSet) (apply func() error) {
	type given struct {
		backend, key string
		value        *string
	}
	var flags []given
	for _, b := range core.BuiltIns() {
		for _, s := range b.Settings {
			help := fmt.Sprintf("%s for the %s backend: %s", s.Doc, b.Name, strings.Join(s.Values, "|"))
			if s.Default != "" {
				help += " (default " + s.Default + ")"
			}
			flags = append(flags, given{b.Name, s.Key, fs.String(b.Name+"-"+s.Key, "", help)})
		}
	}
	return func() error {
		for _, f := range flags {
			if *f.value == "" {
				continue
			}
			if err := core.SetBackendSetting(f.backend, f.key, *f.value); err != nil {
				return fmt.Errorf("--%s-%s: %w", f.backend, f.key, err)
			}
		}
		return nil
	}
}
