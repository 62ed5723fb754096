// Package neon holds the Go tests of the CPU plugin (NEON kernels; SIMDe on x86-64). Its C
// sources build build/plugins/libxpu-neon*.so, which the loader opens at run time.
package neon
