#!/usr/bin/env bash
# Start time and memory of `xpu run`, beside llama.cpp's llama-simple on the same GGUF.
#
#   bench/start.sh [MODEL.gguf ...]
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/start.sh build/models/llama-1b-q4_0.gguf
#
# Per model, ROUNDS interleaved rounds (the order rotated every round, so that a load change on
# a shared machine hits both) of `xpu run MODEL -n N -p Once` and, given LLAMA_BIN, of
# `llama-simple -m MODEL -n N Once`: each run's wall time (from the shell's clock, start to
# exit) and peak resident memory (GNU time's %M). It prints one table row per model and program
# with the medians, the ratio to llama-simple and the load averages seen. The first xpu run
# of a model is untimed: it fills the probe cache, as any earlier start on the machine has.
#
# Settings, from the environment:
#   LLAMA_BIN   folder holding llama-simple (a llama.cpp build's bin/); without it xpu alone
#   XPU         the xpu binary (default build/xpu)
#   ROUNDS      rounds (default 9)           N   tokens to generate (default 1)
#   XPU_FLAGS   extra `xpu run` flags
#   RECORD      1: also store every xpu figure in lab/results/startup.jsonl (bench/lib.sh's
#               record_result); `make perf-table` then renders docs/PERFORMANCE.md
# Without MODEL arguments it uses ../shared/models/stories260K.gguf.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

die() {
	echo "start: $*" >&2
	exit 2
}

case "${1:-}" in
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
esac

XPU=${XPU:-build/xpu}
ROUNDS=${ROUNDS:-9}
N=${N:-1}
read -r -a XPU_EXTRA <<<"${XPU_FLAGS:-}"
for v in ROUNDS N; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: want a whole number ≥ 1"
done
[[ -x "$XPU" ]] || die "no xpu binary at XPU=$XPU (run make all)"
[[ -x /usr/bin/time ]] || die "GNU time (/usr/bin/time) is needed for the peak memory (apt-get install time)"
SIMPLE=
if [[ -n "${LLAMA_BIN:-}" ]]; then
	SIMPLE="$LLAMA_BIN/llama-simple"
	[[ -x "$SIMPLE" ]] || die "no executable llama-simple in LLAMA_BIN=$LLAMA_BIN"
fi
models=("$@")
((${#models[@]} > 0)) || models=("$BENCH_ROOT/../shared/models/stories260K.gguf")
for i in "${!models[@]}"; do
	[[ ${models[$i]} == /* ]] || models[$i]="$PWD/${models[$i]}"
done
for f in "${models[@]}"; do
	[[ -f "$f" ]] || die "no model file $f"
done

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
results="$OUT/results.tsv" # model, program, wall ms, peak KiB, load average

# measure MODEL NAME CMD...: one run, its wall time and peak memory appended to results.
measure() {
	local f=$1 who=$2 t0 t1 kb load
	shift 2
	load=$(load1)
	t0=$EPOCHREALTIME
	if ! /usr/bin/time -f %M -o "$OUT/rss" "$@" >/dev/null 2>"$OUT/log"; then
		echo "start: failed: $*" >&2
		tail -5 "$OUT/log" >&2
		exit 1
	fi
	t1=$EPOCHREALTIME
	kb=$(tail -1 "$OUT/rss")
	awk -v a="$t0" -v b="$t1" -v f="$f" -v w="$who" -v k="$kb" -v l="$load" \
		'BEGIN { printf "%s\t%s\t%.2f\t%s\t%s\n", f, w, (b - a) * 1000, k, l }' >>"$results"
}

xpu_run() { measure "$2" xpu "$XPU" run -m "$2" -n "$N" -p Once "${XPU_EXTRA[@]}"; }
simple_run() { measure "$2" llama-simple "$SIMPLE" -m "$2" -n "$N" Once; }

for f in "${models[@]}"; do
	"$XPU" run -m "$f" -n 1 -p Once "${XPU_EXTRA[@]}" >/dev/null 2>&1 || true # fills the probe cache
done
programs=(xpu_run)
[[ -z "$SIMPLE" ]] || programs=(simple_run xpu_run)
for ((round = 1; round <= ROUNDS; round++)); do
	for f in "${models[@]}"; do
		n=${#programs[@]}
		for ((i = 0; i < n; i++)); do
			"${programs[$(((i + round - 1) % n))]}" "$round" "$f"
		done
	done
done

echo "## xpu run -n $N beside llama-simple"
echo
echo "$(date -u +%FT%TZ), $(BENCH_BANDWIDTH=0 machine), $ROUNDS rounds, xpu $(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo "?")${XPU_FLAGS:+ ($XPU_FLAGS)}"
echo
echo "| model | program | wall ms | peak RSS MiB | wall / llama-simple | load avg |"
echo "|---|---|--:|--:|--:|--:|"
rows=$(for f in "${models[@]}"; do
	for who in llama-simple xpu; do
		w=$(awk -F'\t' -v f="$f" -v p="$who" '$1 == f && $2 == p { print $3 }' "$results" | median)
		[[ -n "$w" ]] || continue
		k=$(awk -F'\t' -v f="$f" -v p="$who" '$1 == f && $2 == p { print $4 }' "$results" | median)
		s=$(awk -F'\t' -v f="$f" '$1 == f && $2 == "llama-simple" { print $3 }' "$results" | median)
		l=$(awk -F'\t' -v f="$f" -v p="$who" '$1 == f && $2 == p { print $5 }' "$results" | sort -g | sed -n '1p;$p' | paste -sd' ')
		m=$(basename "$f" .gguf)
		ratio=-
		[[ -z "$s" ]] || ratio=$(awk -v a="$w" -v b="$s" 'BEGIN { printf "%.2f", a / b }')
		printf "%s\t%s\t%.1f\t%.1f\t%s\t%s\n" "$m" "$who" "$w" "$(awk -v k="$k" 'BEGIN { print k / 1024 }')" "$ratio" "${l/ /–}"
	done
done)
while IFS=$'\t' read -r m who w k ratio l; do
	echo "| $m | $who | $w | $k | $ratio | $l |"
done <<<"$rows"

if [[ ${RECORD:-0} == 1 ]]; then
	cmd="ROUNDS=$ROUNDS N=$N${XPU_FLAGS:+ XPU_FLAGS=\"$XPU_FLAGS\"}${SIMPLE:+ LLAMA_BIN=…} bench/start.sh ${models[*]}"
	cmd=${cmd//"$BENCH_ROOT/"/}
	while IFS=$'\t' read -r m who w k ratio l; do
		[[ $who == xpu ]] || continue
		sw=$(awk -F'\t' -v m="$m" '$1 == m && $2 == "llama-simple" { print $3 }' <<<"$rows")
		sk=$(awk -F'\t' -v m="$m" '$1 == m && $2 == "llama-simple" { print $4 }' <<<"$rows")
		size=
		for f in "${models[@]}"; do
			[[ $(basename "$f" .gguf) == "$m" ]] && size=$(stat -L -c %s "$f" | awk '{ printf "%.1f", $1 / 1048576 }')
		done
		record_result startup "$m xpu run -n $N, wall" "$w" ms "$cmd" "${sw:+llama-simple: $sw ms (${ratio}×); }load $l"
		record_result startup "$m xpu run -n $N, peak RSS" "$k" MiB "$cmd" "model file $size MiB${sk:+; llama-simple: $sk MiB}"
	done <<<"$rows"
fi
