#!/usr/bin/env bash
# K-quant GEMV next to Q4_0 (issue 14): interleaved rounds of BenchmarkGEMVKQuant, one test
# binary, every contender once per round, then the median GB/s (of the weights' GGUF bytes) and
# CPU seconds per GEMV of each, and the ratio of each K-quant's median GB/s to Q4_0's on the
# same shape. Run from the repository root after `make plugins`.
#
#   bench/kquant-gemv.sh [rounds] [benchtime]      (defaults: 7 rounds, 50x)
#
# XPU_BENCH_THREADS (default 2) and XPU_BENCH_PLUGIN (default: the best NEON build) apply.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
rounds=${1:-7}
benchtime=${2:-50x}
bin=$(mktemp -d)/bench.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" ./kernelbench/
out=$(mktemp)
echo "machine: $(machine)" >&2
load_line before >&2
for r in $(seq "$rounds"); do
  for dt in q4_0 q4_k q5_k q6_k q8_0; do
    (cd kernelbench && "$bin" -test.run '^$' -test.bench "GEMVKQuant/.*/$dt/neon\$" -test.benchtime "$benchtime") |
      grep '^BenchmarkGEMVKQuant' >>"$out"
  done
done
load_line after >&2
# name ... N ns/op GB/s cpu-s/op: medians per (shape, dtype), ratios against q4_0
awk '
  { split($1, p, "/"); key = p[2] " " p[3]; gbs[key] = gbs[key] " " $5; cpu[key] = cpu[key] " " $7; shapes[p[2]] = 1 }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    printf "%-14s %-5s %10s %12s %14s\n", "shape", "dtype", "GB/s", "cpu-ms/op", "GB/s vs q4_0"
    for (s in shapes) {
      base = median(gbs[s " q4_0"])
      split("q4_0 q4_k q5_k q6_k q8_0", dts, " ")
      for (i = 1; i <= 5; i++) {
        k = s " " dts[i]
        if (!(k in gbs)) continue
        g = median(gbs[k])
        printf "%-14s %-5s %10.2f %12.3f %14.2f\n", s, dts[i], g, 1000 * median(cpu[k]), g / base
      }
    }
  }' "$out"
rm -f "$out"
