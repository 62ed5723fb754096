// Package bench holds the CPU benchmarks of issue 4: GEMM at prefill shapes in GFLOP/s, GEMV
// at decode shapes in GB/s of weights streamed, and a STREAM-style read bandwidth of the same
// machine, for the NEON plugin side by side with core/ref and OpenBLAS. Run it with
// `make bench-neon` (it builds the plugins and the OpenBLAS harness first); the figures and
// the machine they came from are kept in BENCHMARKS.md.
package bench
