#!/usr/bin/env bash
# Profiler and solver on this machine: time `xpu tune --profile` for a model, solve a plan from
# the profile, then measure the solver's plan, its best layer split and its best single-unit
# plan with `xpu run --plan` (interleaved rounds, medians) so the solver's PREDICTED prefill
# speeds sit next to MEASURED ones. Where the plan splits rows over two units, the same plan
# from `xpu plan --steal` runs too ("steal": the splits balanced at run time).
#
#   bench/solver.sh [MODEL.gguf] [UNITS] [ROUNDS]
#
# Defaults: ../shared/models/stories260K.gguf, neon,opencl,qnn, 3 rounds; PROMPT_REPEAT (12)
# sets the prompt, PROMPT_TOKENS (578) the length the solver plans for, DECODE_TOKENS (16) the
# decode; KEEP=DIR keeps the profile, the plans and the solver's output there. The cache goes to a
# temporary directory (nothing is left in ~/.cache). Prints the load average before and after.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
units=${2:-neon,opencl,qnn}
rounds=${3:-3}
xpu=build/xpu
[ -x "$xpu" ] || make cli >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XPU_CACHE_DIR=$tmp
echo "machine: $(machine)"
load_line before

start=$(date +%s.%N)
$xpu tune --profile --model "$model" --units "$units" -o "$tmp/profile.json" >"$tmp/tune.log"
end=$(date +%s.%N)
printf 'xpu tune --profile: %.1f s wall (%s)\n' "$(echo "$end - $start" | bc)" "$(grep '^measured in' "$tmp/tune.log")"

# the prompt: PROMPT_REPEAT times one sentence (12: 578 tokens with the 1B model's vocabulary);
# PROMPT_TOKENS is the length the solver plans for (the runs print the real one)
prompt=$tmp/prompt.txt
for _ in $(seq 1 "${PROMPT_REPEAT:-12}"); do printf 'Once upon a time, there was a little girl who loved to play in the park. '; done >"$prompt"
ntok=${PROMPT_TOKENS:-578}
# the solver's plan, and the best plan of each kind it can make: a layer split and one unit
$xpu plan --model "$model" --units "$units" --prompt "$ntok" --compare -o "$tmp/plan.json" >"$tmp/plan.txt" 2>&1
sed -n '/^comparison/,$p' "$tmp/plan.txt" | grep -v '^plan written'
pred() { sed -nE 's/^ +predicted .* = ([0-9.]+) tok\/s.*/\1/p' "$1" | head -1; }
$xpu plan --model "$model" --units "$units" --prompt "$ntok" --mode split -o "$tmp/split.json" >"$tmp/split.txt" 2>&1 || true
$xpu plan --model "$model" --units "$units" --prompt "$ntok" --mode single -o "$tmp/single.json" >"$tmp/single.txt" 2>&1
# the solver's plan with its rows splits over two units stealing (xpu plan --steal): the same
# placement and ratios, balanced at run time
$xpu plan --model "$model" --units "$units" --prompt "$ntok" --steal -o "$tmp/steal.json" >"$tmp/steal.txt" 2>&1
declare -A predicted=([plan]=$(pred "$tmp/plan.txt") [split]=$(pred "$tmp/split.txt") [single]=$(pred "$tmp/single.txt") [steal]=$(pred "$tmp/steal.txt"))
grep -E '^prefill:' "$tmp/plan.txt" | sed 's/^/solver plan, /'
labels="plan single"
[ -s "$tmp/split.json" ] && labels="plan split single"
grep -q '"steal": true' "$tmp/steal.json" && labels="$labels steal"

run() { # $1: label, rest: xpu run flags; prints "label prefill_tok_s decode_tok_s"
	local label=$1
	shift
	local err
	err=$($xpu run --model "$model" -f "$prompt" -n "${DECODE_TOKENS:-16}" --temp 0 "$@" 2>&1 >/dev/null)
	local pf dc
	pf=$(echo "$err" | sed -nE 's/^prefill: .* ([0-9.]+) tok\/s.*/\1/p')
	dc=$(echo "$err" | sed -nE 's/^decode: .* ([0-9.]+) tok\/s.*/\1/p')
	echo "$label $pf $dc"
	echo "$err" | grep -E '^prefill:' | sed "s/^/  $label: /" >&2
}
: >"$tmp/runs"
for r in $(seq 1 "$rounds"); do
	for label in $labels; do
		run "$label" --plan "$tmp/$label.json" >>"$tmp/runs"
	done
done
declare -A measured
for label in $labels; do
	pf=$(awk -v l=$label '$1==l {print $2}' "$tmp/runs" | median)
	dc=$(awk -v l=$label '$1==l {print $3}' "$tmp/runs" | median)
	measured[$label]=$pf
	echo "MEASURED $label: prefill $pf tok/s, decode $dc tok/s (median of $rounds); PREDICTED prefill ${predicted[$label]} tok/s"
done
for label in $labels; do
	[ "$label" = single ] && continue
	printf 'prefill %s / single: predicted %.2fx, measured %.2fx\n' "$label" \
		"$(echo "${predicted[$label]} / ${predicted[single]}" | bc -l)" "$(echo "${measured[$label]} / ${measured[single]}" | bc -l)"
done
load_line after
if [ -n "${KEEP:-}" ]; then # keep the profile, the plans and the solver's output
	mkdir -p "$KEEP" && cp "$tmp"/*.json "$tmp"/*.txt "$tmp/runs" "$KEEP"/
fi
