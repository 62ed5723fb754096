#!/usr/bin/env bash
# Profiler and solver on this machine: time `xpu tune --profile` for a model, solve a plan from
# the profile, then measure the plan against the best single unit with `xpu run` (interleaved
# rounds, medians) so the solver's PREDICTED prefill/decode speeds sit next to MEASURED ones.
#
#   scripts/bench-solver.sh [MODEL.gguf] [UNITS] [ROUNDS]
#
# Defaults: ../shared/models/stories260K.gguf, neon,opencl,qnn, 3 rounds. The cache goes to a
# temporary directory (nothing is left in ~/.cache). Prints the load average before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
units=${2:-neon,opencl,qnn}
rounds=${3:-3}
xpu=build/xpu
[ -x "$xpu" ] || make build/xpu >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XPU_CACHE_DIR=$tmp
echo "load before: $(cat /proc/loadavg)"

start=$(date +%s.%N)
$xpu tune --profile --model "$model" --units "$units" -o "$tmp/profile.json" >"$tmp/tune.log"
end=$(date +%s.%N)
printf 'xpu tune --profile: %.1f s wall (%s)\n' "$(echo "$end - $start" | bc)" "$(grep '^measured in' "$tmp/tune.log")"

# a prompt of about 200 tokens
prompt=$tmp/prompt.txt
for _ in $(seq 1 12); do printf 'Once upon a time, there was a little girl who loved to play in the park. '; done >"$prompt"
$xpu plan --model "$model" --units "$units" --prompt 200 --compare -o "$tmp/plan.json" >"$tmp/plan.txt" 2>&1
grep -E '^(prefill|decode):|predicted' "$tmp/plan.txt"
# the single unit runs the solver's single-unit plan (its chunk length), not xpu run's default
$xpu plan --model "$model" --units "$units" --prompt 200 --mode single -o "$tmp/single.json" >"$tmp/single.txt" 2>&1
grep -E "^(prefill|decode):" "$tmp/single.txt" | sed "s/^/single-unit plan, /"

run() { # $1: label, rest: xpu run flags; prints "label prefill_tok_s decode_tok_s"
	local label=$1
	shift
	local err
	err=$($xpu run --model "$model" -f "$prompt" -n 32 --temp 0 "$@" 2>&1 >/dev/null)
	local pf dc
	pf=$(echo "$err" | sed -nE 's/^prefill: .* ([0-9.]+) tok\/s.*/\1/p')
	dc=$(echo "$err" | sed -nE 's/^decode: .* ([0-9.]+) tok\/s.*/\1/p')
	echo "$label $pf $dc"
}
: >"$tmp/runs"
for r in $(seq 1 "$rounds"); do
	run plan --plan "$tmp/plan.json" >>"$tmp/runs"
	run single --plan "$tmp/single.json" >>"$tmp/runs"
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for label in plan single; do
	pf=$(awk -v l=$label '$1==l {print $2}' "$tmp/runs" | median)
	dc=$(awk -v l=$label '$1==l {print $3}' "$tmp/runs" | median)
	echo "MEASURED $label: prefill $pf tok/s, decode $dc tok/s (median of $rounds)"
done
echo "load after: $(cat /proc/loadavg)"
