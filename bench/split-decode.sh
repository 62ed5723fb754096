#!/usr/bin/env bash
# Issue 15's decode targets: 1B decode with every MATMUL row-split over two pinned single-thread
# neon units against each unit alone and against one neon unit with two threads. Interleaved
# rounds, medians; prints the load average before and after.
#
#   bench/split-decode.sh [MODEL.gguf] [ROUNDS] [TOKENS]
#
# Defaults: /tmp/ck/1b-q4_0.gguf (build/xpu gen-model --arch llama --params 1B --type q4_0), 3
# rounds, 48 tokens. XPU_SPLIT_RATIO=0.5 sets unit 0's share of each MATMUL's rows (default 0.5);
# XPU_SPLIT_CHAIN=1 puts the non-MATMUL ops (and the prefill) on unit 1 instead of unit 0.
# XPU_SPLIT_TRACE=DIR also writes one --trace of each configuration there. XPU_SPLIT_BASE=XPU
# (another build's xpu binary, e.g. main's, with its plugins beside it in plugins/) also runs
# the split and one pinned unit with that binary in every round, for an A/B in one run.
# Each round also runs "steal": the same split with stealing row splits ("steal": true in the
# plan: each unit takes row chunks from its end until none are left, sched/split_steal.go),
# and "heads" and "steal-heads": split and steal with each layer's attention split by KV heads
# over the two units too (sched/split_heads.go). "adapt" and "adapt-heads" are split and heads
# with adaptive row splits ("adapt": true: the cut moves between prepared cut points from the
# parts' measured times, sched/split_adapt.go). "shards" is a sharded decode (the plan's
# decode shards, llm/shard/decode.go: each unit runs its KV heads from Q/K/V to the output projection's
# columns and its FFN neurons from gate/up to the down projection's columns, two meetings a
# layer) and "adapt-shards" the same with the neurons' cut moving from token to token by the
# units' busy times, "steal-shards" with the neurons in pieces each unit takes from its end within
# every step. XPU_SPLIT_LABELS="adapt-heads heads unit0"
# runs only those configurations (default: all). XPU_SPLIT_WAITS=N traces N more rounds of the
# two-unit configurations and prints what their meetings cost. XPU_SPLIT_BOUND=N traces N more rounds of
# unit 0 and heads and prints where the split's time goes (see the block near the end).
# Labels "bw1" and "bw2" measure the machine's memory read bandwidth in the same rounds
# (llm's BenchmarkReadBandwidth: one goroutine pinned to core 0, two on cores 0 and 1; GB/s in
# the tok/s column): decode of a 1B Q4_0 model streams its weights, so a split over the two cores
# gains at most about what the second core adds to the read bandwidth, bw2 / bw1.
# Speculative decoding is off (--spec off): its verify passes are not decode steps.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
model=${1:-/tmp/ck/1b-q4_0.gguf}
rounds=${2:-3}
ntok=${3:-48}
ratio=${XPU_SPLIT_RATIO:-0.5}
chain=${XPU_SPLIT_CHAIN:-0}
xpu=build/xpu
[ -x "$xpu" ] || make all >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
u0='neon{cpus=0,threads=1}'
u1='neon{cpus=1,threads=1}'
r1=$(echo "1 - $ratio" | bc -l | sed 's/^\./0./')
cat >"$tmp/split.json" <<JSON
{"units": ["$u0", "$u1"],
 "decode": {"rules": [
   {"ops": ["MATMUL"], "split": {"strategy": "rows", "units": ["0", "1"], "ratio": [$ratio, $r1]}},
   {"unit": "$chain"}]},
 "prefill": {"rules": [{"unit": "$chain"}]}}
JSON
# the same with stealing row splits (sched/split_steal.go): the ratio is then unused in decode
sed 's/"ratio": \[\([^]]*\)\]}/"ratio": [\1], "steal": true}/' "$tmp/split.json" >"$tmp/steal.json"
# and with adaptive row splits (sched/split_adapt.go)
sed 's/"ratio": \[\([^]]*\)\]}/"ratio": [\1], "adapt": true}/' "$tmp/split.json" >"$tmp/adapt.json"
# each of them with the attention split by KV heads too (sched/split_heads.go, op set 4)
heads='{"ops": ["ATTENTION"], "split": {"strategy": "heads", "units": ["0", "1"], "ratio": [0.5, 0.5]}},'
for f in split steal adapt; do
	awk -v r="$heads" '{print} /"decode": \{"rules": \[/ {print "   " r}' "$tmp/$f.json" >"$tmp/$f-heads.json"
done
# and a sharded decode (Megatron-style, llm/shard/decode.go): each unit runs its KV heads' Q/K/V, RoPE,
# attention and output-projection columns, and its FFN neurons, two meetings a layer
cat >"$tmp/shards.json" <<JSON
{"units": ["$u0", "$u1"],
 "decode": {"shards": {"units": ["0", "1"], "ratio": [$ratio, $r1]}, "rules": [{"unit": "$chain"}]},
 "prefill": {"rules": [{"unit": "$chain"}]}}
JSON
# adapt-shards: the same, the FFN neurons' cut moving from token to token by the units' busy times
sed 's/"units": \["0", "1"\], "ratio"/"units": ["0", "1"], "adapt": true, "ratio"/' "$tmp/shards.json" >"$tmp/adapt-shards.json"
# steal-shards: the FFN's neurons in pieces each unit takes from its end within every step
sed 's/"units": \["0", "1"\], "ratio"/"units": ["0", "1"], "steal": true, "ratio"/' "$tmp/shards.json" >"$tmp/steal-shards.json"
prompt=$tmp/prompt.txt
for _ in $(seq 1 4); do printf 'Once upon a time, there was a little girl who loved to play in the park. '; done >"$prompt"
echo "machine: $(machine)"
load_line before
run() { # $1: label, rest: xpu run flags; prints "label decode_tok_s"
	local label=$1
	shift
	local err
	local bin=$xpu
	if [ "$label" != "${label%-base}" ]; then bin=$XPU_SPLIT_BASE; fi
	err=$($bin run --model "$model" -f "$prompt" -n "$ntok" --temp 0 --spec off --stats "$@" 2>&1 >/dev/null) || {
		echo "$label failed: $err" >&2
		return 1
	}
	echo "$label $(echo "$err" | sed -nE 's/^decode: .* ([0-9.]+) tok\/s.*/\1/p')"
	if [ -n "${XPU_SPLIT_VERBOSE:-}" ]; then echo "$err" | grep -iE 'bubble|busy|decode' >&2; fi
}
bandwidth() { # $1: bw1 or bw2; prints "label GB/s"
	[ -x "$tmp/llm.test" ] || go test -c -o "$tmp/llm.test" ./llm
	local n=${1#bw} cpus=0
	[ "$n" = 2 ] && cpus=0,1
	echo "$1 $(cd llm && taskset -c $cpus "$tmp/llm.test" -test.run '^$' -test.bench ReadBandwidth \
		-test.benchtime 10x -test.cpu "$n" | sed -nE 's/.* ([0-9.]+) GB\/s$/\1/p')"
}
: >"$tmp/runs"
labels=${XPU_SPLIT_LABELS:-split steal adapt heads steal-heads adapt-heads shards adapt-shards steal-shards unit0 unit1 threads2}
if [ -n "${XPU_SPLIT_BASE:-}" ]; then labels="$labels split-base unit0-base"; fi
for r in $(seq 1 "$rounds"); do
	echo "round $r: $(load_line)"
	for label in $labels; do
		case $label in
		split | split-base) run "$label" --plan "$tmp/split.json" ;;
		steal | adapt) run "$label" --plan "$tmp/$label.json" ;;
		heads) run heads --plan "$tmp/split-heads.json" ;;
		shards | adapt-shards | steal-shards) run "$label" --plan "$tmp/$label.json" ;;
		steal-heads | adapt-heads) run "$label" --plan "$tmp/$label.json" ;;
		unit0 | unit0-base) run "$label" --units "$u0" ;;
		unit1) run unit1 --units "$u1" ;;
		threads2) run threads2 --units 'neon{threads=2}' ;;
		bw1 | bw2) bandwidth "$label" ;;
		*) echo "unknown configuration $label" >&2 && exit 2 ;;
		esac >>"$tmp/runs"
	done
done
declare -A m
for label in $labels; do
	m[$label]=$(awk -v l=$label '$1==l {print $2}' "$tmp/runs" | median)
	echo "$label: decode ${m[$label]} tok/s (median of $rounds; rounds: $(awk -v l=$label '$1==l {printf "%s ", $2}' "$tmp/runs"))"
done
ratio() { # $1 / $2 where both ran; $3: the target note
	if [ -n "${m[$1]:-}" ] && [ -n "${m[$2]:-}" ]; then
		echo "$1 / $2 = $(echo "${m[$1]} / ${m[$2]}" | bc -l | cut -c1-5)${3:+ ($3)}"
	fi
}
for s in split steal adapt heads steal-heads adapt-heads shards adapt-shards steal-shards; do
	ratio "$s" unit0 "target >= 1.7"
	ratio "$s" unit1
	ratio "$s" threads2 "target >= 0.95"
done
ratio bw2 bw1 "what the second core adds to the read bandwidth"
if [ -n "${XPU_SPLIT_BASE:-}" ]; then
	echo "base: split / unit0 = $(echo "${m[split-base]} / ${m[unit0-base]}" | bc -l | cut -c1-5), split / threads2 = $(echo "${m[split-base]} / ${m[threads2]}" | bc -l | cut -c1-5)"
fi
if [ -n "${XPU_SPLIT_TRACE:-}" ]; then
	mkdir -p "$XPU_SPLIT_TRACE"
	$xpu run --model "$model" -f "$prompt" -n 8 --temp 0 --spec off --plan "$tmp/split.json" --trace "$XPU_SPLIT_TRACE/split.json" >/dev/null 2>&1
	$xpu run --model "$model" -f "$prompt" -n 8 --temp 0 --spec off --plan "$tmp/steal.json" --trace "$XPU_SPLIT_TRACE/steal.json" >/dev/null 2>&1
	$xpu run --model "$model" -f "$prompt" -n 8 --temp 0 --spec off --plan "$tmp/split-heads.json" --trace "$XPU_SPLIT_TRACE/heads.json" >/dev/null 2>&1
	$xpu run --model "$model" -f "$prompt" -n 8 --temp 0 --spec off --plan "$tmp/adapt-heads.json" --trace "$XPU_SPLIT_TRACE/adapt-heads.json" >/dev/null 2>&1
	$xpu run --model "$model" -f "$prompt" -n 8 --temp 0 --spec off --units "$u0" --trace "$XPU_SPLIT_TRACE/unit0.json" >/dev/null 2>&1
	# per decode token of the split and steal traces: wall, and per unit its split MATMUL parts
	# (with the chunks it took, stealing), its other tasks and its waits for the other unit (ms)
	for f in split steal heads adapt-heads; do
		echo "$f trace:"
		python3 - "$XPU_SPLIT_TRACE/$f.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
xs = [e for e in ev if e.get("ph") == "X"]
for r in [e for e in xs if names.get(e["tid"]) == "requests" and "decode" in e["name"]]:
    t0, t1 = r["ts"], r["ts"] + r["dur"]
    cols = []
    for tid, n in names.items():
        if n in ("requests", "speculative"):
            continue
        mine = [e for e in xs if e["tid"] == tid and t0 <= e["ts"] <= t1]
        wait = lambda e: e["name"].startswith("wait")
        part = lambda e: any(s in e["name"] for s in ("[rows", "[steal", "[kv heads", "[adapt"))
        ms = lambda f: sum(e["dur"] for e in mine if f(e)) / 1000
        cnt = lambda f: len([e for e in mine if f(e)])
        other = lambda e: not part(e) and not wait(e)
        chunks = [e["args"]["stolen_chunks"] for e in mine if "stolen_chunks" in e["args"]]
        cuts = {e["args"]["cut"] for e in mine if "cut" in e["args"]}
        cols.append("%s: parts %.1f%s%s, %d other tasks %.1f, %d waits %.1f" % (n, ms(part),
            " (%d chunks)" % sum(chunks) if chunks else "", " (cut %s)" % sorted(cuts) if cuts else "",
            cnt(other), ms(other), cnt(wait), ms(wait)))
    print("token %.1f ms | %s" % (r["dur"] / 1000, " | ".join(cols)))
PY
	done
fi
# XPU_SPLIT_BOUND=N: N more rounds, each tracing unit 0 alone and the heads split (every token
# of a -n TOKENS run, the first two left out), alternated. Per round and as medians over the
# rounds: unit 0's decode token, the split's token, the slower unit's split parts, the chain (the
# other tasks, all on unit 0) and the rest (waits and gaps between tasks). "parts only" is unit
# 0's token over the slower unit's parts: the split's ratio were the chain and the waits free,
# i.e. what the two cores' memory traffic leaves for it.
if [ -n "${XPU_SPLIT_BOUND:-}" ]; then
	for r in $(seq 1 "$XPU_SPLIT_BOUND"); do
		$xpu run --model "$model" -f "$prompt" -n "$ntok" --temp 0 --spec off --units "$u0" --trace "$tmp/bound-u0-$r.json" >/dev/null 2>&1
		$xpu run --model "$model" -f "$prompt" -n "$ntok" --temp 0 --spec off --plan "$tmp/split-heads.json" --trace "$tmp/bound-heads-$r.json" >/dev/null 2>&1
	done
	python3 - "$tmp" "$XPU_SPLIT_BOUND" <<'PY'
import json, statistics as S, sys
def load(f):
    ev = json.load(open(f))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    xs = [e for e in ev if e.get("ph") == "X"]
    return names, xs, [e for e in xs if names.get(e["tid"]) == "requests" and "decode" in e["name"]][2:]
rows = []
for r in range(1, int(sys.argv[2]) + 1):
    solo = S.median(e["dur"] for e in load("%s/bound-u0-%d.json" % (sys.argv[1], r))[2])
    names, xs, reqs = load("%s/bound-heads-%d.json" % (sys.argv[1], r))
    units = sorted(n for n in set(names.values()) if n not in ("requests", "speculative"))
    tok, parts, chain = [], [], []
    for q in reqs:
        t0, t1 = q["ts"], q["ts"] + q["dur"]
        per, oth = dict.fromkeys(units, 0), 0
        for e in xs:
            n = names.get(e["tid"])
            if n in per and t0 <= e["ts"] <= t1 and not e["name"].startswith("wait"):
                if any(s in e["name"] for s in ("[rows", "[kv heads")):
                    per[n] += e["dur"]
                else:
                    oth += e["dur"]
        tok.append(q["dur"]); parts.append(max(per.values())); chain.append(oth)
    row = [solo, S.median(tok), S.median(parts), S.median(chain)]
    rows.append(row)
    print("bound round %d: unit0 %.1f ms, heads %.1f ms (%.3fx), slower unit's parts %.1f ms (parts only %.3fx), chain %.1f ms, rest %.1f ms"
          % (r, row[0] / 1e3, row[1] / 1e3, row[0] / row[1], row[2] / 1e3, row[0] / row[2], row[3] / 1e3, (row[1] - row[2] - row[3]) / 1e3))
m = [S.median(c) for c in zip(*rows)]
print("bound, medians of %d rounds: heads / unit0 %.3f, parts only %.3f; per token: chain %.1f ms, rest %.1f ms of %.1f ms"
      % (len(rows), S.median(r[0] / r[1] for r in rows), S.median(r[0] / r[2] for r in rows), m[3] / 1e3, (m[1] - m[2] - m[3]) / 1e3, m[1] / 1e3))
PY
fi
# XPU_SPLIT_WAITS=N: N more rounds, each tracing every two-unit configuration of the labels
# (alternated, -n TOKENS, the first two tokens left out). Per configuration, medians over its
# tokens and then over the rounds: the token's wall time, each unit's busy time (its partition
# runs, waits left out), and wall less the busier unit's busy time: what the meetings cost,
# independent of how fast the cores happen to be in that round.
if [ -n "${XPU_SPLIT_WAITS:-}" ]; then
	traced=""
	for label in $labels; do
		case $label in unit0 | unit1 | threads2 | *-base) ;; *) traced="$traced $label" ;; esac
	done
	for r in $(seq 1 "$XPU_SPLIT_WAITS"); do
		for label in $traced; do
			plan=$tmp/$label.json
			[ "$label" = heads ] && plan=$tmp/split-heads.json
			$xpu run --model "$model" -f "$prompt" -n "$ntok" --temp 0 --spec off --plan "$plan" --trace "$tmp/waits-$label-$r.json" >/dev/null 2>&1
		done
	done
	python3 - "$tmp" "$XPU_SPLIT_WAITS" $traced <<'PY'
import json, statistics as S, sys
tmp, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for label in labels:
    rows = []
    for r in range(1, rounds + 1):
        ev = json.load(open("%s/waits-%s-%d.json" % (tmp, label, r)))["traceEvents"]
        names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
        xs = [e for e in ev if e.get("ph") == "X"]
        units = sorted(n for n in set(names.values()) if n not in ("requests", "speculative"))
        reqs = [e for e in xs if names.get(e["tid"]) == "requests" and "decode" in e["name"]][2:]
        toks = []
        for q in reqs:
            t0, t1 = q["ts"], q["ts"] + q["dur"]
            busy = dict.fromkeys(units, 0)
            for e in xs:
                n = names.get(e["tid"])
                if n in busy and t0 <= e["ts"] <= t1 and not e["name"].startswith("wait"):
                    busy[n] += e["dur"]
            toks.append([q["dur"]] + [busy[u] for u in units] + [q["dur"] - max(busy.values())])
        rows.append([S.median(c) for c in zip(*toks)])
    m = [S.median(c) for c in zip(*rows)]
    print("waits %s, medians of %d rounds, per token: wall %.1f ms, busy %s ms, wall - busier unit %.2f ms (rounds: %s)"
          % (label, rounds, m[0] / 1e3, " / ".join("%.1f" % (b / 1e3) for b in m[1:-1]), m[-1] / 1e3,
             " ".join("%.2f" % (row[-1] / 1e3) for row in rows)))
PY
fi
load_line after
