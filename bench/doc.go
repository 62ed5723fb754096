// Package bench holds the benchmark harnesses (shell scripts sharing bench/lib.sh) and the
// tests that check their settings and arithmetic without the programs they compare. The Go
// kernel benchmarks behind `xpu bench --kernels` are package kernelbench.
package bench
