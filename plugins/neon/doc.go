// Package neon holds the Go tests of the NEON CPU plugin (libxpu-neon*.so, C11 in csrc/): they
// load the built plugin through the loader and check its kernels, thread pool and ABI behaviour
// beyond the conformance suite (README.md describes the plugin).
package neon
