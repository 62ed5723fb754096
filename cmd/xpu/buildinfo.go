package main

import "runtime/debug"

// buildVersionCommit is the module version and the commit this binary was built from, for the
// provenance of conformance reports: the toolchain's VCS stamp, else the Makefile's
// -X main.commit, else "unknown".
func buildVersionCommit() (version, rev string) {
	version, rev = "(devel)", commit
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				rev = s.Value
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	return version, rev
}
