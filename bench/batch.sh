#!/usr/bin/env bash
# Continuous batching, measured as clients see it: `xpu serve --parallel N` and, when
# LLAMA_BIN holds one, llama.cpp's `llama-server -np N`, each loaded with one streaming client
# alone and then with CLIENTS streaming clients at once.
#
#   bench/batch.sh [MODEL.gguf ...]
#   LLAMA_BIN=/path/to/llama.cpp/build/bin CLIENTS=8 TG=64 bench/batch.sh build/models/llama-1b-q4_0.gguf
#
# Every client streams POST /v1/completions (temperature 0, max_tokens TG, ignore_eos for the
# servers that know it) with a prompt of its own and timestamps every streamed piece. Per server
# and model it prints one table row:
#   alone t/s      one client's decode rate: (pieces - 1) / (last - first piece)
#   N clients t/s  the aggregate decode rate while every client decodes: the pieces streamed
#                  between the last client's first piece and the first client's last piece,
#                  over that window (the whole span when the window is empty)
#   ratio          N clients / alone: memory-bound decode that reads the weights once per
#                  step for all sequences approaches N
#   gap p50, p99   inter-token gaps over all clients of the N-client run, in ms, and the worst
#                  client's p99 / its own median (a stalled stream shows here). A streamed piece
#                  may carry several tokens: a token that ends inside a UTF-8 character streams
#                  no text, and the next piece carries both (a model with random weights, as
#                  gen-model writes, samples such byte tokens often). The clients ask for
#                  timings_per_token (llama-server's extension, which both servers honour), whose
#                  predicted_n counts the tokens so far; a piece of k tokens after a gap of g
#                  counts as k gaps of g/k.
#   per piece      the worst client's p99 / median over the pieces as they arrive, each piece
#                  one gap whatever it carries
# Each figure is the median over ROUNDS rounds; the servers alternate which goes first every
# round (bench/lib.sh interleave), as the machine may be shared: the load average before each
# run is in the log.
#
# Settings, from the environment:
#   XPU         the xpu binary (default build/xpu)
#   LLAMA_BIN   folder holding llama-server (empty: xpu only)
#   CLIENTS     concurrent clients and server slots (default 8)
#   TG          tokens per request (default 64)     ROUNDS  rounds (default 2)
#   CTX         context per slot (default 512)      THREADS llama-server -t (default: nproc)
#   XPU_FLAGS   extra `xpu serve` flags             LLAMA_FLAGS extra llama-server flags
#   LLAMA_OMP_WAIT  OMP_WAIT_POLICY of llama-server (default: unset, OpenMP's own; PASSIVE keeps
#               its threads from spinning at barriers, which on a machine with more runnable
#               threads than cores makes every step wait for descheduled spinners)
#   PORT        first port to use (default 18481; each server start takes the next one)
#   OUT         folder for logs (default a new one in build/)
#   MODELS_DIR  where the default model is generated (default build/models)
#   RECORD      1: store the xpu rows in lab/results/serving.jsonl (record_result)
# Without MODEL arguments it uses MODELS_DIR/llama-1b-q4_0.gguf (written with `xpu gen-model`
# and `xpu quantize` when absent) and ../shared/models/stories260K.gguf when present. The
# script downloads nothing.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

die() {
	echo "batch: $*" >&2
	exit 2
}

XPU=${XPU:-$BENCH_ROOT/build/xpu}
CLIENTS=${CLIENTS:-8}
TG=${TG:-64}
ROUNDS=${ROUNDS:-2}
CTX=${CTX:-512}
THREADS=${THREADS:-$(nproc)}
PORT=${PORT:-18481}
MODELS_DIR=${MODELS_DIR:-$BENCH_ROOT/build/models}
OUT=${OUT:-$(mktemp -d "$BENCH_ROOT/build/batch.XXXXXX")}
[ -x "$XPU" ] || die "no xpu binary at $XPU (make all)"
[[ $CLIENTS =~ ^[1-9][0-9]*$ && $TG =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] ||
	die "CLIENTS, TG and ROUNDS must be positive integers"
mkdir -p "$OUT"

models=("$@")
if [ ${#models[@]} -eq 0 ]; then
	mkdir -p "$MODELS_DIR"
	f=$MODELS_DIR/llama-1b-q4_0.gguf
	if [ ! -f "$f" ]; then
		"$XPU" gen-model --arch llama --params 1B --type f16 -o "$MODELS_DIR/llama-1b-f16.gguf" >&2
		"$XPU" quantize --type q4_0 "$MODELS_DIR/llama-1b-f16.gguf" "$f" >&2
		rm -f "$MODELS_DIR/llama-1b-f16.gguf"
	fi
	models=("$f")
	s=$BENCH_ROOT/../shared/models/stories260K.gguf
	[ -f "$s" ] && models+=("$s")
fi

servers=(xpu)
if [ -n "${LLAMA_BIN:-}" ]; then
	[ -x "$LLAMA_BIN/llama-server" ] || die "no llama-server in $LLAMA_BIN"
	servers+=(llama)
fi

pid=
stop_server() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		pid=
	fi
}
trap stop_server EXIT

# start_server NAME MODEL LOG: starts it on $PORT and waits until /health answers 200.
start_server() {
	local name=$1 model=$2 log=$3 i
	PORT=$((PORT + 1)) # a server still closing its socket does not block the next
	case $name in
	xpu)
		# shellcheck disable=SC2086
		"$XPU" serve "$model" --name m --port "$PORT" --parallel "$CLIENTS" --ctx "$CTX" --max-tokens "$TG" ${XPU_FLAGS:-} >"$log" 2>&1 &
		;;
	llama)
		# shellcheck disable=SC2086
		${LLAMA_OMP_WAIT:+env OMP_WAIT_POLICY=$LLAMA_OMP_WAIT} "$LLAMA_BIN/llama-server" -m "$model" --port "$PORT" -np "$CLIENTS" -c $((CLIENTS * CTX)) -t "$THREADS" \
			${LLAMA_FLAGS:-} >"$log" 2>&1 &
		;;
	esac
	pid=$!
	for ((i = 0; i < 600; i++)); do
		if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || die "$name did not start: $(tail -5 "$log")"
		sleep 0.5
	done
	die "$name: no /health after 300 s"
}

# load N: N streaming clients at once; prints "alone_rate aggregate_rate p50 p99 worst_ratio
# worst_ratio_per_piece" (rates in tokens per second).
load() {
	python3 - "$PORT" "$1" "$TG" <<'PY'
import json, sys, threading, time, http.client, statistics
port, n, tg = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
topics = ["a dog", "the sea", "a red ball", "the moon", "a little girl", "a big tree", "a cat", "the rain",
          "a boat", "a bird", "a cake", "the park", "a king", "a fox", "a train", "the sun"]
stamps = [[] for _ in range(n)]
errors = []
def client(i):
    body = json.dumps({"model": "m", "prompt": "Once upon a time there was " + topics[i % len(topics)] + ".",
                       "max_tokens": tg, "temperature": 0, "stream": True, "ignore_eos": True,
                       "timings_per_token": True})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            errors.append(f"client {i}: HTTP {r.status}: {r.read()[:200]!r}")
            return
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                # the tokens so far; without timings, each piece counts as one token
                n = (ev.get("timings") or {}).get("predicted_n", len(stamps[i]) + 1)
                stamps[i].append((time.monotonic(), n))
    except Exception as e:
        errors.append(f"client {i}: {e}")
ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    print("; ".join(errors), file=sys.stderr)
    sys.exit(1)
stamps = [s for s in stamps if len(s) >= 2]
if not stamps:
    print("no client streamed two pieces", file=sys.stderr)
    sys.exit(1)
# the rates count tokens: (time, tokens so far) per piece
alone = statistics.median((s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0]) for s in stamps)
lo, hi = max(s[0][0] for s in stamps), min(s[-1][0] for s in stamps)
inside = sum(b[1] - a[1] for s in stamps for a, b in zip(s, s[1:]) if lo < b[0] <= hi)
if hi - lo > 0 and inside >= n:
    agg = inside / (hi - lo)
else:
    agg = sum(s[-1][1] - s[0][1] for s in stamps) / (max(s[-1][0] for s in stamps) - min(s[0][0] for s in stamps))
def token_gaps(s):
    return [(b[0] - a[0]) / max(1, b[1] - a[1]) for a, b in zip(s, s[1:]) for _ in range(max(1, b[1] - a[1]))]
def piece_gaps(s):
    return [b[0] - a[0] for a, b in zip(s, s[1:])]
def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]
def worst(gaps_of):
    return max(p99(gaps_of(s)) / statistics.median(gaps_of(s)) for s in stamps)
gaps = [g for s in stamps for g in token_gaps(s)]
print(f"{alone:.3f} {agg:.3f} {1000 * statistics.median(gaps):.1f} {1000 * p99(gaps):.1f} {worst(token_gaps):.2f} {worst(piece_gaps):.2f}")
PY
}

results=$OUT/results.tsv
: >"$results"
echo "machine: $(BENCH_BANDWIDTH=0 machine); out: $OUT" >&2

# run ROUND SERVER: one server on the current model: one client alone (after one warm-up
# request), then CLIENTS at once.
run() {
	local round=$1 name=$2 log alone many
	log=$OUT/$name-$(basename "$model" .gguf)-$round.log
	echo "$(load_line "$name round $round")" >&2
	start_server "$name" "$model" "$log"
	load 1 >/dev/null
	alone=$(load 1)
	many=$(load "$CLIENTS")
	stop_server
	printf '%s\t%s\t%s\t%s\t%s\n' "$(basename "$model")" "$name" "$round" "$(cut -d' ' -f1 <<<"$alone")" "$many" >>"$results"
}

for model in "${models[@]}"; do
	[ -f "$model" ] || die "no model $model"
	interleave "$ROUNDS" run "${servers[@]}"
done

echo "| model | server | alone t/s | $CLIENTS clients t/s | ratio | gap p50 ms | gap p99 ms | worst p99/p50 | per piece |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|"
awk -F'\t' '{ print $1 "\t" $2 }' "$results" | sort -u | while IFS=$'\t' read -r m s; do
	col() { awk -F'\t' -v m="$m" -v s="$s" -v c="$1" '$1 == m && $2 == s { split($5, f, " "); print (c == 0 ? $4 : f[c]) }' "$results" | median; }
	a=$(col 0) g=$(col 2) p50=$(col 3) p99=$(col 4) w=$(col 5) wp=$(col 6)
	ratio=$(awk -v a="$a" -v g="$g" 'BEGIN { printf "%.2f", g / a }')
	echo "| $m | $s | $a | $g | $ratio | $p50 | $p99 | $w | $wp |"
	if [ "${RECORD:-0}" = 1 ] && [ "$s" = xpu ]; then
		record_result serving "$m $CLIENTS streams aggregate decode" "$g" tok/s "bench/batch.sh $m" \
			"alone $a tok/s, ratio $ratio, worst p99/p50 inter-token gap $w (per piece $wp)"
	fi
done
