#!/usr/bin/env bash
# Speculative decoding (issue 17): xpu's drafters against plain decoding and llama.cpp's
# llama-lookup on the same GGUF and prompt, greedy, same thread count, side by side.
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/spec.sh
#
# The summary-style task: the prompt holds a story twice (the first STORY_BYTES bytes of the
# model's published greedy sample, ../shared/models/stories260K.greedy.txt, read at run time),
# and the model goes on from there, retelling it. Each round runs every configuration once, in
# a rotating order, so that a load change on a shared machine hits all of them; the table has
# the medians over the rounds of decode tokens/s and tokens per forward pass (verify or
# decode), and each one's ratio to xpu's plain decoding of the same round.
#
# history-auto and history-always repeat the request with --spec-task: the task's earlier
# answer (written by one untimed run first) is a drafting source, CoordGen's history store.
# other-history holds answers to six other story prompts only (bench/spec-history.sh), the
# store put back before every run; llama-lookup-other is llama-lookup with its dynamic cache
# (-lcd) filled from the same prompts the same way.
#
# On a loaded machine wall-clock tok/s swings 2-4x between runs: bench/spec-cpu.sh measures the
# same task in CPU time per token, and `go test ./llm/spec -run X -bench VerifyPass` one pass per
# length (cpu-ns/op).
#
# Then the back-off check: a random-weight 1B model (drafts cannot hit, except where its own
# output repeats), xpu's default (--spec auto) against --spec off, ROUNDS_1B rounds.
#
# Settings, from the environment:
#   LLAMA_BIN    folder holding llama-cli and llama-lookup (default /work/llama.cpp/build/bin;
#                rows are left out when absent)
#   XPU          the xpu binary (default build/xpu)    BACKEND  xpu's --backend (default neon)
#   MODEL        default ../shared/models/stories260K.gguf
#   THREADS      -t of both programs (default 1)       N        tokens to generate (default 200)
#   ROUNDS       rounds (default 5)                    STORY_BYTES default 500
#   MODEL_1B     the random-weight model (default build/models/llama-1b-q4_0.gguf, written by
#                `xpu gen-model` when absent; "none" skips the check)
#   N_1B, ROUNDS_1B, THREADS_1B  default 64, 3, 2
set -euo pipefail
. "$(dirname "$0")/lib.sh"

XPU=${XPU:-build/xpu}
BACKEND=${BACKEND:-neon}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
LLAMA_BIN=${LLAMA_BIN:-/work/llama.cpp/build/bin}
THREADS=${THREADS:-1}
N=${N:-200}
ROUNDS=${ROUNDS:-5}
STORY_BYTES=${STORY_BYTES:-500}
MODEL_1B=${MODEL_1B:-build/models/llama-1b-q4_0.gguf}
N_1B=${N_1B:-64}
ROUNDS_1B=${ROUNDS_1B:-3}
THREADS_1B=${THREADS_1B:-2}

story=$(head -c "$STORY_BYTES" "$(dirname "$MODEL")/stories260K.greedy.txt" | tr '\n' ' ')
prompt="$story $story"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# xpu_run NAME FLAGS...: one xpu run; prints "NAME tok/s tokens/pass"
xpu_run() {
	local name=$1
	shift
	"$XPU" run --model "$MODEL" --backend "$BACKEND" -t "$THREADS" --temp 0 -n "$N" --stats -p "$prompt" "$@" \
		>"$out/$name.txt" 2>"$out/$name.err"
	local tps tpp
	tps=$(sed -n 's/^decode: .* \([0-9.]*\) tok\/s.*/\1/p' "$out/$name.err")
	tpp=$(sed -n 's/^speculative: \([0-9.]*\) tokens\/pass.*/\1/p' "$out/$name.err")
	echo "$name $tps ${tpp:-1.00}"
}

llama_plain() {
	"$LLAMA_BIN/llama-cli" -m "$MODEL" -n "$N" -t "$THREADS" --temp 0 -no-cnv -p "$prompt" </dev/null >"$out/lp.txt" 2>&1
	# the decode steps' own rate: "eval time = X ms / R runs (Y ms per token, Z tokens per second)"
	awk '/llama_perf_context_print: +eval time/ { tps = $(NF-3) } END { if (tps > 0) printf "llama-cli %s 1.00\n", tps }' "$out/lp.txt"
}

# llama_lookup [NAME FLAGS...]: llama-lookup, by default as llama-lookup with no cache
llama_lookup() {
	local name=${1:-llama-lookup}
	shift || true
	"$LLAMA_BIN/llama-lookup" -m "$MODEL" -n "$N" -t "$THREADS" --temp 0 -p "$prompt" "$@" >"$out/ll.txt" 2>&1
	awk -v name="$name" '/^decoded/ { tps = $(NF-1) } /^n_predict/ { np = $3 } /^n_accept/ { na = $3 }
		END { if (np > na) printf "%s %s %.2f\n", name, tps, np / (np - na) }' "$out/ll.txt"
}

# history-*: the same request again with --spec-task (earlier answers are a drafting source;
# the store is filled by one untimed run first). other-history: --spec-task with a store of
# the model's answers to six OTHER story prompts only (bench/spec-history.sh), put back before
# every run: CoordGen's task history without the measured prompt's own answer in it.
export XPU_CACHE_DIR="$out/cache"
# shellcheck source=bench/spec-history.sh
source "$(dirname "$0")/spec-history.sh"
configs=(plain auto retrieval-always lookup-always history-auto history-always other-history)
have_llama=0
if [[ -x $LLAMA_BIN/llama-cli && -x $LLAMA_BIN/llama-lookup ]]; then
	configs+=(llama-cli llama-lookup llama-lookup-other)
	have_llama=1
fi
run_config() {
	case $1 in
	plain) xpu_run plain --spec off ;;
	auto) xpu_run auto ;;
	retrieval-always) xpu_run retrieval-always --spec retrieval --spec-always ;;
	lookup-always) xpu_run lookup-always --spec lookup --spec-always ;;
	history-auto) xpu_run history-auto --spec-task bench ;;
	history-always) xpu_run history-always --spec retrieval --spec-always --spec-task bench ;;
	other-history) restore_other && xpu_run other-history --spec-task other ;;
	llama-cli) llama_plain ;;
	llama-lookup) llama_lookup ;;
	llama-lookup-other) restore_other_llama && llama_lookup llama-lookup-other -lcd "$out/live.lcd" ;;
	esac
}

xpu_run warm-history --spec-task bench >/dev/null
fill_other
if ((have_llama)); then fill_other_llama; fi
echo "# $(date -u +%FT%TZ) $(nproc) cores; model $MODEL; prompt ${#prompt} bytes; -n $N; -t $THREADS; llama.cpp: $have_llama" >&2
: >"$out/results"
echo "machine: $(machine)" >&2
one() { echo "$(($1 - 1)) $(run_config "$2") $(load1)" >>"$out/results"; }
interleave "$ROUNDS" one "${configs[@]}"
# the xpu outputs are plain decoding's (the script checks, as the tests do)
for c in auto retrieval-always lookup-always history-auto history-always other-history; do
	cmp -s "$out/plain.txt" "$out/$c.txt" || echo "WARNING: $c's text differs from plain decoding's" >&2
done

echo "| configuration | decode tok/s | × xpu plain | tokens/pass | load avg |"
echo "|---|--:|--:|--:|--:|"
awk '
	function median(list,    a, n, i, j, t) {
		n = split(list, a, " ")
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 }
	  tps[$2] = tps[$2] " " $3; tpp[$2] = tpp[$2] " " $4; loads[$2] = loads[$2] " " $5; per[$1, $2] = $3 }
	END {
		for (r = 0; (r, "plain") in per; r++)
			for (i = 1; i <= k; i++) ratio[order[i]] = ratio[order[i]] " " per[r, order[i]] / per[r, "plain"]
		for (i = 1; i <= k; i++) { c = order[i]
			printf "| %s | %.0f | %.2f | %.2f | %s |\n", c, median(tps[c]), median(ratio[c]), median(tpp[c]), median(loads[c]) }
	}' "$out/results"

[[ $MODEL_1B == none ]] && exit 0
if [[ ! -f $MODEL_1B ]]; then
	mkdir -p "$(dirname "$MODEL_1B")"
	"$XPU" gen-model --arch llama --params 1B --type q4_0 -o "$MODEL_1B" >&2
fi
: >"$out/r1b"
for ((r = 0; r < ROUNDS_1B; r++)); do
	for s in off auto; do
		[[ $(((r % 2))) == 1 ]] && s=$([[ $s == off ]] && echo auto || echo off)
		"$XPU" run --model "$MODEL_1B" --backend "$BACKEND" -t "$THREADS_1B" --temp 0 -n "$N_1B" -c 256 --stats \
			--spec "$s" -p "Once upon a time there was a little girl" >/dev/null 2>"$out/1b.err"
		echo "$r $s $(sed -n 's/^decode: .* \([0-9.]*\) tok\/s.*/\1/p' "$out/1b.err") $(load1)" >>"$out/r1b"
	done
done
echo
echo "| random-weight 1B ($MODEL_1B), -n $N_1B, -t $THREADS_1B | tok/s off | tok/s auto | auto/off (median of rounds) | load avg |"
echo "|---|--:|--:|--:|--:|"
awk '
	function median(list,    a, n, i, j, t) {
		n = split(list, a, " ")
		for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ v[$1, $2] = $3; all[$2] = all[$2] " " $3; loads = loads " " $4; if ($1 > R) R = $1 }
	END { for (r = 0; r <= R; r++) ratios = ratios " " v[r, "auto"] / v[r, "off"]
		printf "| back-off | %.1f | %.1f | %.2f | %s |\n", median(all["off"]), median(all["auto"]), median(ratios), median(loads) }' "$out/r1b"
