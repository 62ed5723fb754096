#!/usr/bin/env bash
# Tree-mask attention on the neon plugin (BenchmarkAttentionTree, plugins/neon/attn_mask_test.go):
# this tree's AVX-512 build against a base commit's, interleaved rounds, so the mask's cost and
# the unmasked (decode, causal chunk) paths' speed are compared under the same load.
# Usage: bench/attn-tree.sh [BASE_COMMIT] [ROUNDS]   (run `make plugins` first)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
base=${1:-c40d1f7}
rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$base" abi plugins/neon/csrc plugins/common | tar -x -C "$work"
flags=(-std=c11 -g -fPIC -Wall -Wextra -Werror -fvisibility=hidden -I"$work/abi" -I"$work/plugins/common" -D_GNU_SOURCE -O3)
mkdir -p "$work/out"
cc "${flags[@]}" -DNV_VARIANT='"avx512"' -DNV_REQUIRE=2 -c -o "$work/probe.o" "$work/plugins/neon/csrc/probe.c"
cc "${flags[@]}" -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -DNV_VARIANT='"avx512"' \
  -o "$work/out/libxpu-neon-avx512.so" $(ls "$work"/plugins/neon/csrc/*.c | grep -v probe.c) "$work/probe.o" \
  -shared -lpthread -ldl -lm
cd "$root"
go test -c -o "$work/neon.test" ./plugins/neon
echo "machine: $(machine)"
load_line
for r in $(seq "$rounds"); do
  for who in base new; do
    if [ "$who" = base ]; then export XPU_PLUGIN_PATH="$work/out"; else export XPU_PLUGIN_PATH="$root/build/plugins"; fi
    (cd plugins/neon && "$work/neon.test" -test.run '^$' -test.bench 'AttentionTree/libxpu-neon-avx512' -test.benchtime 20x) |
      awk -v w="$who" -v r="$r" '/^Benchmark/ {print "round " r " " w ": " $1 " " $3 " " $4 " " $5 " " $6}'
  done
done
load_line
