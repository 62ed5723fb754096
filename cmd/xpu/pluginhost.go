package main

import (
	"context"
	"fmt"
	"io"

	"github.com/xpuhub/xpu/loader"
)

// plugin-host is started by the loader, never by hand: it opens one plugin in this (child)
// process and serves it to the parent over go-plugin's gRPC for an isolated backend
// (loader.Isolated, XPU_ISOLATE).
func init() {
	register(&command{
		name:    "plugin-host",
		summary: "serve one plugin to an xpu parent process (started by the loader)",
		hidden:  true,
		run: func(_ context.Context, args []string, _, stderr io.Writer) int {
			if len(args) != 1 {
				fmt.Fprintln(stderr, "usage: xpu plugin-host <plugin file> (started by the xpu loader)")
				return 2
			}
			if err := loader.ServePluginHost(args[0]); err != nil {
				fmt.Fprintln(stderr, "xpu plugin-host:", err)
				return 1
			}
			return 0
		},
	})
}
