// Package kernelbench holds the CPU kernel benchmarks behind `xpu bench --kernels`: GEMM at
// prefill shapes in GFLOP/s, GEMV at decode shapes in GB/s of weights streamed, and a
// STREAM-style read bandwidth of the same machine, for the NEON plugin side by side with
// core/ref and OpenBLAS. `make bench-neon` builds the plugins and the OpenBLAS harness and runs
// the `go test -bench` benchmarks of this package; docs/PERFORMANCE.md has the current figures.
package kernelbench
