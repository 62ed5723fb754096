package main

import (
	"context"
	"io"

	"github.com/xpuhub/xpu/loader"
)

// plugin-host is started by the loader, never by hand: `plugin-host <plugin>` opens one plugin
// in this (child) process and serves it to the parent over go-plugin's gRPC for an isolated
// backend (loader.Isolated, XPU_ISOLATE); `plugin-host --probe [--open] <plugin>` probes one
// plugin file for discovery and answers on stdout. The loader's init normally does this work
// before main runs (the child is recognised by its environment); this command is the same
// entry point spelled out, for an XPU_PLUGIN_HOST binary of another build.
func init() {
	register(&command{
		name:    "plugin-host",
		summary: "serve or probe one plugin for an xpu parent process (started by the loader)",
		hidden:  true,
		run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
			return loader.PluginHostMain(args, stdout, stderr)
		},
	})
}
