#!/usr/bin/env bash
# llama.cpp's llama-bench (and ik_llama.cpp's, given IK_LLAMA_BIN) and `xpu bench -m` on the
# same GGUF files, side by side.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/vs-llamacpp.sh [MODEL.gguf ...]
#   make bench-vs-llamacpp LLAMA_BIN=/path/to/llama.cpp/build/bin [VS_MODELS="a.gguf b.gguf"]
#
# Per model it measures prompt processing (ppPP), decode on an empty cache (tgTG) and decode
# with DEPTH tokens already in the cache (tgTG @ dDEPTH), both programs with the same thread
# count, in ROUNDS rounds; each round runs the two programs one after the other, alternating
# which goes first, so that a load change on a shared machine hits both. It prints one table
# row per model and test: the medians over the rounds of each program's tokens/s and the ratio
# xpu/llama.cpp, with the range of the per-round ratios (how noisy the run was) and the load
# average seen before each run.
#
# Depth: llama-bench builds that have -d measure "tgTG @ dDEPTH" directly. For older ones the
# script reads llama-cli's own timing of its decode steps after a DEPTH-token prompt ("eval
# time" of llama_perf_context_print: TG-1 steps at cache positions DEPTH+1..., greedy), or, with
# LLAMA_DEPTH=pg or no llama-cli, derives it from -pg DEPTH,TG minus -p DEPTH (TG tokens over the
# time pg took beyond the prefill): the same steps, but a difference of two long timings, which
# a loaded machine makes noisy. xpu always uses -d.
#
# Settings, from the environment:
#   LLAMA_BIN   (required) folder holding llama-bench (a llama.cpp build's bin/)
#   IK_LLAMA_BIN folder holding ik_llama.cpp's llama-bench: the llama.cpp fork runs beside the
#               other two in every round, measured the same way, and gets a table of its own
#               (xpu/ik_llama.cpp)
#   XPU         the xpu binary (default build/xpu)
#   ROUNDS      rounds (default 3)          REPS     -r of every run (default 2)
#   THREADS     -t of both (default 2)      PP, TG   prompt / decode lengths (512, 128)
#   DEPTH       cache depth for the decode-at-depth row (default 1024; 0 leaves it out)
#   XPU_FLAGS   extra `xpu bench` flags (e.g. "--backend neon --chunk 128"); xpu runs with
#               --kv f16 unless XPU_FLAGS says otherwise, as llama-bench's cache is f16
#   LLAMA_FLAGS extra llama-bench flags
#   RECORD      1: also store every row's xpu figure in lab/results/llm.jsonl (bench/lib.sh's
#               record_result: a rerun on the same machine replaces the row); `make perf-table` then
#               renders docs/PERFORMANCE.md
#   LLAMA_COMMIT the llama.cpp commit to print (default: llama-bench's build_commit)
#   IK_LLAMA_COMMIT the same for ik_llama.cpp
#   BUSY        1: afterwards, the same rounds at 1 and at 2 threads beside a busy loop pinned
#               to one core, in a second table (a pool that spins for its threads collapses
#               when a core is taken; one that sleeps does not)
#   MODELS_DIR  where the default models are generated (default build/models)
#   OUT         folder for the raw JSON, logs and results.tsv (default a new one in build/)
#   STEP_TIMEOUT seconds one run may take before it is killed (default 1800)
# `bench/vs-llamacpp.sh --table OUT/results.tsv [ik_llama.cpp]` prints a table of an earlier run
# again (against llama.cpp, or the peer named).
# Without MODEL arguments it uses MODELS_DIR/llama-1b-q4_0.gguf and llama-1b-q8_0.gguf, writing
# them with `xpu gen-model` when absent. The script downloads nothing.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

die() {
	echo "vs-llamacpp: $*" >&2
	exit 2
}

# table RESULTS [PEER]: the summary of a results.tsv, medians over the rounds, xpu against PEER
# (default llama.cpp); a per-round ratio pairs the two programs' runs of the same round.
table() {
	local peer=${2:-llama.cpp}
	echo "| model | test | $peer t/s | xpu t/s | xpu/$peer | per-round ratios | load avg |"
	echo "|---|---|--:|--:|--:|--:|--:|"
	awk -F'\t' -v peer="$peer" '
		function median(list,    a, n, i, j, t) {
			n = split(list, a, " ")
			for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{ key = $2 "\t" $4
		  if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
		  v[key, $3] = v[key, $3] " " $5; r[key, $3, $1] = $5; rounds[$1] = 1
		  if ($3 == peer || $3 == "xpu") loads[key] = loads[key] " " $6 }
		END {
		  for (k = 1; k <= nk; k++) {
		    key = order[k]; split(key, kk, "\t"); lo = ""; hi = ""
		    if (!((key, peer) in v)) continue
		    for (rd in rounds) if ((key, peer, rd) in r && (key, "xpu", rd) in r && r[key, peer, rd] > 0) {
		      x = r[key, "xpu", rd] / r[key, peer, rd]
		      if (lo == "" || x < lo) lo = x
		      if (hi == "" || x > hi) hi = x }
		    ml = median(v[key, peer]); mx = median(v[key, "xpu"])
		    n = split(loads[key], la, " "); lmin = la[1]; lmax = la[1]
		    for (i = 2; i <= n; i++) { if (la[i] < lmin) lmin = la[i]; if (la[i] > lmax) lmax = la[i] }
		    ratio = ml > 0 ? sprintf("**%.2f**", mx / ml) : "-"
		    spread = lo == "" ? "-" : sprintf("%.2f–%.2f", lo, hi)
		    m = kk[1]; sub(/.*\//, "", m); sub(/\.gguf$/, "", m)
		    printf "| %s | %s | %.2f | %.2f | %s | %s | %s–%s |\n", m, kk[2], ml, mx, ratio, spread, lmin, lmax
		  }
		}' "$1"
}

case "${1:-}" in
--table)
	[[ -f "${2:-}" ]] || die "--table needs an earlier run's results.tsv"
	table "$2" "${3:-llama.cpp}"
	exit 0
	;;
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
esac

[[ -n "${LLAMA_BIN:-}" ]] || die "LLAMA_BIN is not set: point it at a llama.cpp build's bin folder (the one holding llama-bench); this script downloads and builds nothing"
[[ -d "$LLAMA_BIN" ]] || die "LLAMA_BIN=$LLAMA_BIN is not a folder"
LLAMA_BENCH="$LLAMA_BIN/llama-bench"
[[ -x "$LLAMA_BENCH" ]] || die "no executable llama-bench in LLAMA_BIN=$LLAMA_BIN"
IK_BENCH=
if [[ -n "${IK_LLAMA_BIN:-}" ]]; then
	[[ -d "$IK_LLAMA_BIN" ]] || die "IK_LLAMA_BIN=$IK_LLAMA_BIN is not a folder"
	IK_BENCH="$IK_LLAMA_BIN/llama-bench"
	[[ -x "$IK_BENCH" ]] || die "no executable llama-bench in IK_LLAMA_BIN=$IK_LLAMA_BIN"
fi

XPU=${XPU:-build/xpu}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-2}
THREADS=${THREADS:-2}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-1024}
MODELS_DIR=${MODELS_DIR:-build/models}
STEP_TIMEOUT=${STEP_TIMEOUT:-1800}
read -r -a XPU_EXTRA <<<"${XPU_FLAGS:-}"
read -r -a LLAMA_EXTRA <<<"${LLAMA_FLAGS:-}"

for v in ROUNDS REPS THREADS PP TG STEP_TIMEOUT; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: want a whole number ≥ 1"
done
[[ "$DEPTH" =~ ^[0-9]+$ ]] || die "DEPTH=$DEPTH: want a whole number ≥ 0"
[[ -x "$XPU" ]] || die "no xpu binary at XPU=$XPU (run make all)"
command -v jq >/dev/null || die "jq is needed to read the JSON of both programs (apt-get install jq)"

models=("$@")
if ((${#models[@]} == 0)); then
	mkdir -p "$MODELS_DIR"
	for t in q4_0 q8_0; do
		f="$MODELS_DIR/llama-1b-$t.gguf"
		if [[ ! -f "$f" ]]; then
			echo "vs-llamacpp: writing $f" >&2
			"$XPU" gen-model --arch llama --params 1B --type "$t" -o "$f" >&2
		fi
		models+=("$f")
	done
fi
for f in "${models[@]}"; do
	[[ -f "$f" ]] || die "no model file $f"
done

OUT=${OUT:-$(mkdir -p build && mktemp -d build/vs-llamacpp.XXXXXX)}
mkdir -p "$OUT"
results="$OUT/results.tsv" # round, model, contender, test, tok/s, load average
: >"$results"

# depth_mode BIN: how a llama.cpp-family build in folder BIN measures decode at depth
depth_mode() {
	if "$1/llama-bench" --help 2>&1 | grep -q -- '--n-depth'; then
		echo native
	elif [[ -x "$1/llama-cli" && ${LLAMA_DEPTH:-cli} == cli ]]; then
		echo cli
	else
		echo pg
	fi
}
llama_depth=$(depth_mode "$LLAMA_BIN")
ik_depth=
[[ -z "$IK_BENCH" ]] || ik_depth=$(depth_mode "$IK_LLAMA_BIN")


# jq program: one "n_prompt n_gen n_depth avg_ns avg_ts" line per test of either program.
JQ_ROWS='.[] | [.n_prompt, .n_gen, (.n_depth // 0), .avg_ns, .avg_ts] | @tsv'

# record ROUND MODEL CONTENDER JSON LOAD: turns one run's JSON into results rows.
record() {
	local round=$1 model=$2 who=$3 json=$4 load=$5
	jq -r "$JQ_ROWS" "$json" | awk -v r="$round" -v m="$model" -v w="$who" -v l="$load" \
		-v pp="$PP" -v tg="$TG" -v d="$DEPTH" '
		{ np = $1; ng = $2; nd = $3; ns[np "," ng "," nd] = $4
		  if (np == pp && ng == 0 && nd == 0) printf "%s\t%s\t%s\tpp%s\t%.4f\t%s\n", r, m, w, pp, $5, l
		  if (np == 0 && ng == tg && nd == 0) printf "%s\t%s\t%s\ttg%s\t%.4f\t%s\n", r, m, w, tg, $5, l
		  if (np == 0 && ng == tg && nd == d && d > 0) printf "%s\t%s\t%s\ttg%s @ d%s\t%.4f\t%s\n", r, m, w, tg, d, $5, l }
		END {
		  # an older llama-bench: decode at depth from pp(d)+tg(n) minus pp(d)
		  pg = ns[d "," tg ",0"]; p = ns[d ",0,0"]
		  if (d > 0 && pg > p && p > 0) printf "%s\t%s\t%s\ttg%s @ d%s\t%.4f\t%s\n", r, m, w, tg, d, tg * 1e9 / (pg - p), l }' \
		>>"$results"
}

# run LOG JSON CMD...: one program run with a deadline, its JSON to JSON and its chatter to LOG.
run() {
	local log=$1 json=$2
	shift 2
	echo "+ $*" >>"$log"
	if ! timeout "$STEP_TIMEOUT" "$@" >"$json" 2>>"$log"; then
		echo "vs-llamacpp: failed (log: $log): $*" >&2
		tail -5 "$log" >&2
		exit 1
	fi
}

# peer_runs ROUND MODEL TAG NAME BIN DEPTHMODE: one llama.cpp-family build's runs (llama-bench
# in folder BIN), recorded as contender NAME.
peer_runs() {
	local round=$1 f=$2 tag=$3 who=$4 bin=$5 mode=$6 load
	local pre=${who%%.*}
	pre=${pre//_/-}
	load=$(load1)
	local base=("$bin/llama-bench" -m "$f" -t "$THREADS" -r "$REPS" -o json "${LLAMA_EXTRA[@]}")
	if ((DEPTH > 0)) && [[ $mode == pg ]]; then
		run "$OUT/$pre.log" "$OUT/$pre-$tag-r$round.json" "${base[@]}" -p "$PP,$DEPTH" -n "$TG" -pg "$DEPTH,$TG"
		record "$round" "$f" "$who" "$OUT/$pre-$tag-r$round.json" "$load"
		return
	fi
	run "$OUT/$pre.log" "$OUT/$pre-$tag-r$round.json" "${base[@]}" -p "$PP" -n "$TG"
	record "$round" "$f" "$who" "$OUT/$pre-$tag-r$round.json" "$load"
	if ((DEPTH > 0)) && [[ $mode == native ]]; then
		load=$(load1)
		run "$OUT/$pre.log" "$OUT/$pre-$tag-d-r$round.json" "${base[@]}" -p 0 -n "$TG" -d "$DEPTH"
		record "$round" "$f" "$who" "$OUT/$pre-$tag-d-r$round.json" "$load"
	elif ((DEPTH > 0)); then
		llama_cli_depth "$round" "$f" "$tag" "$who" "$bin"
	fi
}

llama_runs() { peer_runs "$1" "$2" "$3" llama.cpp "$LLAMA_BIN" "$llama_depth"; }
ik_runs() { peer_runs "$1" "$2" "$3" ik_llama.cpp "$IK_LLAMA_BIN" "$ik_depth"; }

# llama_cli_depth ROUND MODEL TAG NAME BIN: decode after a DEPTH-token prompt, timed by BIN's
# llama-cli itself (recorded as contender NAME),
# REPS runs averaged. The prompt is "a a a ...": one token per word with the SentencePiece
# vocabularies of `xpu gen-model` (llama-cli reports the real count, kept in the log).
llama_cli_depth() {
	local round=$1 f=$2 tag=$3 who=$4 bin=$5 load rep log prompt sum=0
	log="$OUT/${who%%.*}-$tag-cli-r$round.log"
	load=$(load1)
	prompt=$(printf 'a %.0s' $(seq 2 "$DEPTH"))
	prompt=${prompt% }
	: >"$log"
	for ((rep = 1; rep <= REPS; rep++)); do
		if ! timeout "$STEP_TIMEOUT" "$bin/llama-cli" -m "$f" -t "$THREADS" -p "$prompt" -n "$TG" \
			--ignore-eos --temp 0 -no-cnv -c $((DEPTH + TG + 16)) "${LLAMA_EXTRA[@]}" </dev/null >/dev/null 2>>"$log"; then
			echo "vs-llamacpp: llama-cli failed (log: $log)" >&2
			tail -5 "$log" >&2
			exit 1
		fi
	done
	# "eval time = 3629.42 ms / 7 runs": one rate per run, averaged like llama-bench's avg_ts
	awk -v r="$round" -v m="$f" -v w="$who" -v l="$load" -v tg="$TG" -v d="$DEPTH" '
		/llama_perf_context_print: +eval time/ {
			ms = 0; n = 0 # the first "ms" is the total; "(... ms per token" follows
			for (i = 1; i <= NF; i++) { if ($i == "ms" && !ms) ms = $(i - 1); if ($i == "runs") n = $(i - 1) }
			if (ms > 0) { sum += n * 1000 / ms; k++ } }
		END { if (k == 0) exit 1
		      printf "%s\t%s\t%s\ttg%s @ d%s\t%.4f\t%s\n", r, m, w, tg, d, sum / k, l }' "$log" >>"$results" ||
		{ echo "vs-llamacpp: no eval time in $log" >&2; exit 1; }
}

xpu_runs() {
	local round=$1 f=$2 tag=$3 load
	load=$(load1)
	# --kv f16: llama-bench's default cache type, so that both read the same K/V bytes at depth
	local base=("$XPU" bench -m "$f" -t "$THREADS" -r "$REPS" -o json --kv f16 "${XPU_EXTRA[@]}")
	run "$OUT/xpu.log" "$OUT/xpu-$tag-r$round.json" "${base[@]}" -p "$PP" -n "$TG"
	record "$round" "$f" xpu "$OUT/xpu-$tag-r$round.json" "$load"
	if ((DEPTH > 0)); then
		load=$(load1)
		run "$OUT/xpu.log" "$OUT/xpu-$tag-d-r$round.json" "${base[@]}" -p 0 -n "$TG" -d "$DEPTH"
		record "$round" "$f" xpu "$OUT/xpu-$tag-d-r$round.json" "$load"
	fi
}

started=$(date -u +%FT%TZ)
echo "vs-llamacpp: ${#models[@]} model(s), $ROUNDS rounds, raw output in $OUT" >&2
machine=$(machine)
contenders=(llama_runs xpu_runs)
[[ -z "$IK_BENCH" ]] || contenders=(llama_runs ik_runs xpu_runs)
# all_rounds [LABEL]: ROUNDS rounds of every contender on every model into $results
all_rounds() {
	local round f tag n i
	for ((round = 1; round <= ROUNDS; round++)); do
		for f in "${models[@]}"; do
			tag=$(basename "$f" .gguf)
			echo "vs-llamacpp: ${1:+$1, }round $round/$ROUNDS, $tag (load $(load1))" >&2
			# each round starts with the next contender, so that a load change hits all alike
			n=${#contenders[@]}
			for ((i = 0; i < n; i++)); do
				"${contenders[$(((i + round - 1) % n))]}" "$round" "$f" "$tag"
			done
		done
	done
}
all_rounds

# BUSY=1: the same rounds again at 1 and 2 threads beside a busy loop pinned to one core (a
# competing process on a phone or a shared server): a thread pool that spins for its workers
# loses the core it waits for, one that sleeps does not
busy_results="$OUT/busy.tsv"
if [[ ${BUSY:-0} == 1 ]]; then
	: >"$busy_results"
	pin=()
	command -v taskset >/dev/null && pin=(taskset -c 0)
	"${pin[@]}" bash -c 'while :; do :; done' &
	busy_pid=$!
	trap 'kill "$busy_pid" 2>/dev/null' EXIT
	quiet_results=$results quiet_threads=$THREADS
	for THREADS in 1 2; do
		results="$OUT/busy-t$THREADS.tsv"
		: >"$results"
		all_rounds "busy loop on one core, $THREADS threads"
		awk -F'\t' -v OFS='\t' -v t="$THREADS" '{ $4 = $4 ", " t " thread" (t > 1 ? "s" : ""); print }' "$results" >>"$busy_results"
	done
	kill "$busy_pid" 2>/dev/null || true
	wait "$busy_pid" 2>/dev/null || true
	trap - EXIT
	results=$quiet_results THREADS=$quiet_threads
fi

# a build made outside a git checkout says "unknown": LLAMA_COMMIT names it then
llama_commit=${LLAMA_COMMIT:-$(jq -r '.[0].build_commit // "?"' "$(ls "$OUT"/llama-*.json | head -1)")}
ik_commit=
[[ -z "$IK_BENCH" ]] || ik_commit=${IK_LLAMA_COMMIT:-$(jq -r '.[0].build_commit // "?"' "$(ls "$OUT"/ik-*.json | head -1)")}
xpu_commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
echo "## xpu vs llama.cpp${IK_BENCH:+ and ik_llama.cpp}"
echo
echo "$started → $(date -u +%FT%TZ), $machine, $THREADS threads, $ROUNDS rounds × -r $REPS;" \
	"llama.cpp $llama_commit (depth: $llama_depth)${IK_BENCH:+, ik_llama.cpp $ik_commit (depth: $ik_depth)}, xpu $xpu_commit${XPU_FLAGS:+ ($XPU_FLAGS)}"
echo
table "$results"
if [[ -n "$IK_BENCH" ]]; then
	echo
	table "$results" ik_llama.cpp
fi
if [[ ${BUSY:-0} == 1 ]]; then
	echo
	echo "### Beside a busy loop on one core (BUSY=1), 1 and 2 threads"
	echo
	table "$busy_results"
	if [[ -n "$IK_BENCH" ]]; then
		echo
		table "$busy_results" ik_llama.cpp
	fi
fi

if [[ ${RECORD:-0} == 1 ]]; then
	cmd="ROUNDS=$ROUNDS REPS=$REPS THREADS=$THREADS PP=$PP TG=$TG DEPTH=$DEPTH${XPU_FLAGS:+ XPU_FLAGS=\"$XPU_FLAGS\"} LLAMA_BIN=… bench/vs-llamacpp.sh ${models[*]}"
	table "$results" | tail -n +3 | while IFS='|' read -r _ m test ml mx ratio _; do
		ratio=$(trim "${ratio//\*/}")
		record_result llm "$(trim "$m") $(trim "$test"), $THREADS threads" "$(trim "$mx")" tok/s "$cmd" \
			"llama.cpp $llama_commit: $(trim "$ml") (${ratio}×)"
	done
fi
