// Package opencl holds the Go tests of the OpenCL GPU plugin (libxpu-opencl.so, C11 in src/):
// they run the conformance suite on the built plugin (PoCL in CI) and check its context options,
// scratch reuse, program cache and cold start (README.md describes the plugin).
package opencl
