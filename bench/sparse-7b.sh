#!/usr/bin/env bash
# Sparse FFN decoding of a ~7B ReLU model under a memory limit, side by side with llama.cpp
# (mmap) and xpu's dense decoding (issue 18). Needs root (cgroup v1 memory controller, drop_caches).
#
#   LLAMA_BIN=/path/to/llama.cpp/build/bin bench/sparse-7b.sh
#   MODE=free CONFIGS="dense sparse" bench/sparse-7b.sh       # the unconstrained case
#   bench/sparse-7b.sh --table OUT/results.tsv                  # print an earlier run's table again
#
# Configurations (CONFIGS, any of):
#   llama   llama-bench -p 0 -n N -t THREADS -r 1 on the SiLU twin (TWIN): llama.cpp has no
#           ReLU-gated llama, and the twin has the same tensors and sizes. llama-bench maps the
#           model (its default, -mmp 1) and reports decode-only tok/s after a 1-token warmup.
#           A llama.cpp built with GGML_CPU_AARCH64=ON (the default) copies every Q4_0 matrix
#           into anonymous memory at load on AVX2/i8mm CPUs (its "CPU_AARCH64" buffer), so the
#           weights no longer live in the mapping; LLAMA_LIBS lets the llama leg load a
#           libggml-cpu.so built with -DGGML_CPU_AARCH64=OFF (LD_LIBRARY_PATH) for a true mmap run.
#   dense   xpu run on the ReLU model (MODEL) with the sparse path off. Under the limit it runs
#           on the unit neon{repack=0}: the Q4_0 weights stay in the file mapping (repacking
#           copies them into anonymous memory at prepare, which cannot fit the limit).
#           In MODE=free it runs on --backend neon with the default repacking.
#   sparse  xpu run --sparse on (the sidecar MODEL.sparse.gguf) with --stats, placed like dense:
#           under the limit on neon{repack=0} (repacking copies the fixed region's weights,
#           1.3 GB for the 7B model, into anonymous memory beside their page cache: OOM-killed
#           at 50%), free on --backend neon.
# All runs decode N tokens greedily (--temp 0, --spec off) from the same prompt (PROMPT; empty =
# BOS only, as llama-bench -p 0), with THREADS threads.
#
# MODE=limit (default): before each run the page cache is dropped (sync; echo 3 >
# /proc/sys/vm/drop_caches) and the cgroup emptied; the run is put into the cgroup v1 memory
# group CGROUP (memory.limit_in_bytes = LIMIT; memory.memsw.limit_in_bytes too when swap is on)
# by a wrapper shell that writes its pid to cgroup.procs and execs the program, so the page
# cache the program faults in is charged to the group. Recorded per run: decode tok/s, wall
# time, the group's memory.max_usage_in_bytes and memory.failcnt (both reset before the run),
# OOM kills of the group (memory.oom_control), the run's major faults and disk reads
# (/usr/bin/time %F, %I). With no swap, limiting memsw changes nothing, and recent kernels
# (6.1x) count failures only on the memory counter: a limited memsw counter fails first and
# uncounted, leaving failcnt at 0 although every charge over the limit had to reclaim.
# Pages already in the page cache are charged to whichever group read them first and are not
# dropped while another process maps them: run this only while no other process has MODEL or
# TWIN open, or the limit does not bind (the script warns when one has).
# MODE=free: the same group with no limit, caches warm (each model read once beforehand).
# MODE=both: limit, then free.
# Rounds are interleaved (each round runs every configuration once, rotating which goes first);
# the table shows medians over the rounds and the ratios sparse/llama, sparse/dense and
# dense/llama of the medians, with the range of the per-round ratios.
#
# Settings, from the environment:
#   MODEL    the ReLU model (default /tmp/sp7b/relu-q4_0.gguf)
#   TWIN     its SiLU twin for llama.cpp (default /tmp/sp7b/silu-q4_0.gguf)
#   LLAMA_BIN folder holding llama-bench (needed for the llama leg)
#   LLAMA_LIBS optional LD_LIBRARY_PATH for the llama leg (see above)
#   LLAMA_FLAGS extra llama-bench flags
#   XPU      the xpu binary (default build/xpu)
#   CONFIGS  default "llama dense sparse"
#   MODE     limit | free | both (default limit)
#   LIMIT    bytes, or with a K/M/G suffix (binary); default 50% of MODEL's file size
#   ROUNDS   rounds (default 3)        N        decode tokens (default 32)
#   THREADS  threads (default 2)       CTX      xpu's context length (default 256)
#   LLAMA_THREADS llama-bench's -t (default THREADS). On a loaded machine llama.cpp's threads
#            spin at every barrier while a sibling is descheduled: -t 1 can then beat -t 2.
#   PROMPT   prompt text (default empty: BOS only)
#   DENSE_FLAGS  replaces the dense leg's placement flags (default: --units
#            'neon{repack=0,threads=THREADS}' under the limit, --backend neon -t THREADS free)
#   SPARSE_FLAGS replaces the sparse leg's placement flags (default: as DENSE_FLAGS')
#   LIMIT_BUDGET the sparse leg's --budget in MODE=limit (default auto: LIMIT less PROCESS_MIB,
#            what the process holds beyond its budget: Go heap, binary and libraries, the
#            sidecar's header; ~110 MiB anonymous + ~60 MiB of code measured for the 7B model;
#            "plan" keeps the sidecar's; a --budget in SPARSE_FLAGS wins)
#   PROCESS_MIB  default 192
#   FREE_BUDGET  the sparse leg's --budget in MODE=free (default 8GiB: everything fits, as the
#            issue's unconstrained case asks; the sidecar's own budget would keep reading
#            cold bundles with O_DIRECT past a warm page cache; "plan" keeps the sidecar's)
#   XPU_FLAGS extra flags for both xpu legs
#   CGROUP   the cgroup folder (default /sys/fs/cgroup/memory/xpu-sparse-bench; created)
#   STEP_TIMEOUT seconds a run may take before it is killed and recorded as a timeout (default 1800)
#   OUT      folder for logs and results.tsv (default a new one in build/)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

die() {
	echo "sparse-7b: $*" >&2
	exit 2
}

# table RESULTS: medians over the rounds per (mode, configuration), then the ratios.
# results.tsv: mode round config model tokens tok/s wall majflt maxrss_kib max_usage failcnt oom status load_before load_after shared read_bytes
# (read_bytes: the run's file system inputs, /usr/bin/time %I × 512: what it read from the disk,
# page cache readahead for its faults included. Major faults say little on their own: one fault
# maps a whole large folio of the page cache, so a fault can stand for megabytes.)
# (shared: "shared" when another process had the model open, so the limit did not bind fully)
table() {
	awk -F'\t' '
		function median(list,    a, n, i, j, t) {
			n = split(list, a, " ")
			if (n == 0) return ""
			for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function add(arr, k, x) { arr[k] = arr[k] " " x }
		NR == 1 && $1 == "mode" { next }
		{ k = $1 SUBSEP $3
		  if (!(k in seen)) { seen[k] = 1; order[++nk] = k; model[k] = $4 }
		  runs[k]++; st[k, $13]++; if ($16 == "shared") sh[k]++
		  if ($13 == "ok") { add(tps, k, $6); tok[k] = $5; r[$1, $3, $2] = $6; rounds[$1, $2] = 1 }
		  add(wall, k, $7); add(flt, k, $8); add(use, k, $10); add(fail, k, $11); add(oom, k, $12)
		  add(lb, k, $14); add(la, k, $15)
		  add(rd, k, $17 / 1048576)
		  if ($5 > 0) { add(fpt, k, $8 / $5); add(rpt, k, $17 / 1048576 / $5) } }
		function range(list,    a, n, i, lo, hi) {
			n = split(list, a, " "); lo = a[1]; hi = a[1]
			for (i = 2; i <= n; i++) { if (a[i] + 0 < lo + 0) lo = a[i]; if (a[i] + 0 > hi + 0) hi = a[i] }
			return n == 0 ? "-" : (lo == hi ? lo : lo "–" hi)
		}
		function status(k,    s, i, n, names, out) {
			out = ""; n = split("ok timeout oom failed", names, " ")
			for (i = 1; i <= n; i++) { s = names[i]; if ((k, s) in st) out = out (out == "" ? "" : ", ") st[k, s] "× " s }
			if (k in sh) out = out ", " sh[k] "× model open elsewhere (limit not binding)"
			return out
		}
		END {
		  print "| mode | config | model | decode t/s | tokens | wall s | cgroup peak MiB | failcnt | OOM kills | major faults | per token | MiB read from disk | per token | runs | load before → after |"
		  print "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"
		  for (i = 1; i <= nk; i++) {
		    k = order[i]; split(k, kk, SUBSEP); m = model[k]; sub(/.*\//, "", m); sub(/\.gguf$/, "", m)
		    t = median(tps[k]); med[k] = t
		    printf "| %s | %s | %s | %s | %s | %.1f | %.0f | %s | %s | %.0f | %s | %.0f | %s | %s | %s → %s |\n", kk[1], kk[2], m,
		      t == "" ? "-" : sprintf("%.3f", t), t == "" ? "-" : tok[k], median(wall[k]), median(use[k]) / 1048576,
		      range(fail[k]), range(oom[k]), median(flt[k]), fpt[k] == "" ? "-" : sprintf("%.0f", median(fpt[k])),
		      median(rd[k]), rpt[k] == "" ? "-" : sprintf("%.0f", median(rpt[k])), status(k), range(lb[k]), range(la[k])
		  }
		  print ""
		  print "| mode | ratio | of the medians | per-round range |"
		  print "|---|---|--:|--:|"
		  np = split("sparse/llama sparse/dense dense/llama", pairs, " ")
		  nm = 0
		  for (i = 1; i <= nk; i++) { md = substr(order[i], 1, index(order[i], SUBSEP) - 1); if (!(md in modes)) { modes[md] = 1; mlist[++nm] = md } }
		  for (mi = 1; mi <= nm; mi++) for (p = 1; p <= np; p++) {
		    md = mlist[mi]
		    split(pairs[p], ab, "/"); a = md SUBSEP ab[1]; b = md SUBSEP ab[2]
		    if (!(a in seen) || !(b in seen)) continue
		    lo = ""; hi = ""
		    for (rk in rounds) { split(rk, rr, SUBSEP); if (rr[1] != md) continue
		      if ((md, ab[1], rr[2]) in r && (md, ab[2], rr[2]) in r && r[md, ab[2], rr[2]] > 0) {
		        x = r[md, ab[1], rr[2]] / r[md, ab[2], rr[2]]
		        if (lo == "" || x < lo) lo = x; if (hi == "" || x > hi) hi = x } }
		    ratio = (med[a] != "" && med[b] != "" && med[b] > 0) ? sprintf("**%.2f**", med[a] / med[b]) : "- (a leg has no finished run)"
		    printf "| %s | %s | %s | %s |\n", md, pairs[p], ratio, lo == "" ? "-" : sprintf("%.2f–%.2f", lo, hi)
		  }
		}' "$1"
}

case "${1:-}" in
--table)
	[[ -f "${2:-}" ]] || die "--table needs an earlier run's results.tsv"
	table "$2"
	exit 0
	;;
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
esac

MODEL=${MODEL:-/tmp/sp7b/relu-q4_0.gguf}
TWIN=${TWIN:-/tmp/sp7b/silu-q4_0.gguf}
XPU=${XPU:-build/xpu}
CONFIGS=${CONFIGS:-llama dense sparse}
MODE=${MODE:-limit}
ROUNDS=${ROUNDS:-3}
N=${N:-32}
PROCESS_MIB=${PROCESS_MIB:-192}
THREADS=${THREADS:-2}
LLAMA_THREADS=${LLAMA_THREADS:-$THREADS}
CTX=${CTX:-256}
PROMPT=${PROMPT:-}
CGROUP=${CGROUP:-/sys/fs/cgroup/memory/xpu-sparse-bench}
STEP_TIMEOUT=${STEP_TIMEOUT:-1800}
read -r -a XPU_EXTRA <<<"${XPU_FLAGS:-}"
read -r -a LLAMA_EXTRA <<<"${LLAMA_FLAGS:-}"

for v in ROUNDS N THREADS LLAMA_THREADS CTX STEP_TIMEOUT; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: want a whole number ≥ 1"
done
case "$MODE" in limit) modes=(limit) ;; free) modes=(free) ;; both) modes=(limit free) ;; *) die "MODE=$MODE: want limit, free or both" ;; esac
read -r -a configs <<<"$CONFIGS"
((${#configs[@]} > 0)) || die "CONFIGS is empty"
for c in "${configs[@]}"; do
	case "$c" in llama | dense | sparse) ;; *) die "CONFIGS: unknown configuration $c (want llama, dense, sparse)" ;; esac
done
want() { [[ " ${configs[*]} " == *" $1 "* ]]; }

[[ $EUID -eq 0 ]] || die "needs root: it drops the page cache and writes a memory cgroup"
[[ -f "$MODEL" ]] || die "no model at MODEL=$MODEL (bench/sparse-offline.sh writes it)"
[[ -d "$(dirname "$CGROUP")" && -f "$(dirname "$CGROUP")/memory.limit_in_bytes" ]] ||
	die "$(dirname "$CGROUP") is not a cgroup v1 memory hierarchy"
[[ -x /usr/bin/time ]] || die "/usr/bin/time (GNU time) is needed for major faults"
command -v jq >/dev/null || die "jq is needed to read llama-bench's JSON"
if want llama; then
	[[ -n "${LLAMA_BIN:-}" ]] || die "LLAMA_BIN is not set: point it at a llama.cpp build's bin folder (the one holding llama-bench)"
	[[ -x "$LLAMA_BIN/llama-bench" ]] || die "no executable llama-bench in LLAMA_BIN=$LLAMA_BIN"
	[[ -f "$TWIN" ]] || die "no SiLU twin at TWIN=$TWIN"
fi
if want dense || want sparse; then
	[[ -x "$XPU" ]] || die "no xpu binary at XPU=$XPU (run make all)"
	xpu_help=$("$XPU" run --help 2>&1 || true)
fi
has_sparse_flag() { [[ "$xpu_help" == *"-sparse"* ]]; }
if want sparse; then
	has_sparse_flag || die "$XPU run has no --sparse flag yet (the sparse runtime is not merged): leave sparse out of CONFIGS"
fi

model_bytes=$(stat -c %s "$MODEL")
if [[ -z "${LIMIT:-}" ]]; then
	LIMIT=$((model_bytes / 2))
else
	case "$LIMIT" in
	*[Kk]) LIMIT=$((${LIMIT%?} * 1024)) ;;
	*[Mm]) LIMIT=$((${LIMIT%?} * 1048576)) ;;
	*[Gg]) LIMIT=$((${LIMIT%?} * 1073741824)) ;;
	*[!0-9]*) die "LIMIT=$LIMIT: want bytes or a K/M/G suffix" ;;
	esac
fi

OUT=${OUT:-$(mkdir -p build && mktemp -d build/sparse-7b.XXXXXX)}
mkdir -p "$OUT"
results="$OUT/results.tsv"
printf 'mode\tround\tconfig\tmodel\ttokens\ttok_s\twall_s\tmajflt\tmaxrss_kib\tmax_usage\tfailcnt\toom_kills\tstatus\tload_before\tload_after\tshared\tread_bytes\n' >"$results"

cg() { cat "$CGROUP/$1" 2>/dev/null || echo 0; }
oom_kills() { awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$CGROUP/memory.oom_control" 2>/dev/null || echo 0; }

mkdir -p "$CGROUP"
# cgroup_limit BYTES|-1: memsw (where the kernel has it) must stay ≥ the memory limit, so lift
# it first and lower it last; it is limited only when swap is on (see above).
cgroup_limit() {
	[[ -f "$CGROUP/memory.memsw.limit_in_bytes" ]] && echo -1 >"$CGROUP/memory.memsw.limit_in_bytes"
	echo "$1" >"$CGROUP/memory.limit_in_bytes"
	if [[ -f "$CGROUP/memory.memsw.limit_in_bytes" && "$1" != -1 && $(wc -l </proc/swaps) -gt 1 ]]; then
		echo "$1" >"$CGROUP/memory.memsw.limit_in_bytes" || echo "sparse-7b: memory.memsw.limit_in_bytes not set" >&2
	fi
	return 0
}

# reset MODE: an empty group (the page cache the last run left charged to it is reclaimed),
# peaks and failure counts back to zero; under the limit the whole page cache is dropped too.
reset() {
	local tries
	for tries in 1 2 3 4 5; do
		[[ -z "$(cat "$CGROUP/cgroup.procs")" ]] && break
		sleep 1
	done
	echo 0 >"$CGROUP/memory.force_empty" 2>/dev/null || true
	if [[ $1 == limit ]]; then
		sync
		echo 3 >/proc/sys/vm/drop_caches
	fi
	echo 0 >"$CGROUP/memory.max_usage_in_bytes"
	echo 0 >"$CGROUP/memory.failcnt"
	if [[ -f "$CGROUP/memory.memsw.failcnt" ]]; then
		echo 0 >"$CGROUP/memory.memsw.max_usage_in_bytes"
		echo 0 >"$CGROUP/memory.memsw.failcnt"
	fi
	return 0
}

# holders FILE: the pids of other processes that have FILE open or mapped (their pages of it
# stay resident and charged to their own group, so the limit would not bind for those pages).
holders() {
	local f
	f=$(readlink -f "$1")
	{
		grep -lsF " $f" /proc/[0-9]*/maps | cut -d/ -f3
		find /proc/[0-9]*/fd -maxdepth 1 -lname "$f" 2>/dev/null | cut -d/ -f3
	} | sort -un | grep -vx -e "$$" -e "$BASHPID" | tr '\n' ' ' || true
}

# measure MODE ROUND CONFIG MODEL PARSER CMD...: one run inside the group, under a deadline;
# PARSER (a function taking the run's stdout and stderr files) prints "tokens tok/s".
measure() {
	local mode=$1 round=$2 config=$3 model=$4 parser=$5
	shift 5
	local tag="$mode-$config-r$round" lb la oom0 oom1 rc status parsed tokens=0 tps=0
	local out="$OUT/$tag.out" errf="$OUT/$tag.err" tf="$OUT/$tag.time"
	reset "$mode"
	local others
	others=$(holders "$model")
	[[ $config == sparse && -f "$model.sparse.gguf" ]] && others+=$(holders "$model.sparse.gguf")
	[[ -z "$others" ]] || echo "sparse-7b: WARNING: $model is open in pids $others: its pages they hold are not charged to the group" >&2
	lb=$(load1)
	oom0=$(oom_kills)
	echo "+ $*" >"$errf"
	echo "sparse-7b: $tag (load $lb): $*" >&2
	rc=0
	# time → timeout → sh (joins the group, then execs the program): the group holds only the program
	/usr/bin/time -f 'TIME %e %F %M %x %I' -o "$tf" timeout -k 10 "$STEP_TIMEOUT" \
		sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CGROUP" "$@" >"$out" 2>>"$errf" </dev/null || rc=$?
	la=$(load1)
	oom1=$(oom_kills)
	local wall majflt maxrss inblocks
	read -r wall majflt maxrss inblocks < <(awk '$1 == "TIME" { print $2, $3, $4, $6 }' "$tf" 2>/dev/null) || true
	status=ok
	if ((rc == 124)); then
		status=timeout
	elif ((oom1 > oom0)); then
		status=oom
	elif ((rc != 0)); then
		status=failed
	elif parsed=$("$parser" "$out" "$errf") && [[ -n "$parsed" ]]; then
		read -r tokens tps <<<"$parsed"
	else
		status=failed
	fi
	[[ $status == ok ]] || echo "sparse-7b: $tag: $status (rc $rc; log $errf)" >&2
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$round" "$config" "$model" \
		"$tokens" "$tps" "${wall:-0}" "${majflt:-0}" "${maxrss:-0}" "$(cg memory.max_usage_in_bytes)" \
		$(($(cg memory.failcnt) + $(cg memory.memsw.failcnt))) $((oom1 - oom0)) "$status" "$lb" "$la" "${others:+shared}" \
		$((${inblocks:-0} * 512)) >>"$results"
}

# parse_llama OUT ERR: llama-bench's JSON (the decode test).
parse_llama() {
	jq -r '.[] | select(.n_gen > 0 and .n_prompt == 0) | "\(.n_gen) \(.avg_ts)"' "$1" 2>/dev/null | head -1
}

# parse_xpu OUT ERR: "decode: 8 tokens in 23456.7 ms, 0.3 tok/s, ..." (xpu times tokens-1
# steps); the rate from the milliseconds, as the printed one has one decimal.
parse_xpu() {
	awk '$1 == "decode:" && $3 == "tokens" && $4 == "in" && $6 == "ms," {
		if ($2 > 1 && $5 > 0) printf "%d %.6f\n", $2, ($2 - 1) * 1000 / $5 }' "$2" | tail -1
}

run_config() {
	local mode=$1 round=$2 c=$3
	local xpu_common=(--temp 0 --spec off -n "$N" --ctx "$CTX" --kv f16)
	[[ -n "$PROMPT" ]] && xpu_common+=(-p "$PROMPT")
	case "$c" in
	llama)
		local env=()
		[[ -n "${LLAMA_LIBS:-}" ]] && env=(env "LD_LIBRARY_PATH=$LLAMA_LIBS")
		measure "$mode" "$round" llama "$TWIN" parse_llama "${env[@]}" "$LLAMA_BIN/llama-bench" -m "$TWIN" \
			-p 0 -n "$N" -t "$LLAMA_THREADS" -r 1 -o json "${LLAMA_EXTRA[@]}"
		;;
	dense)
		local place
		if [[ -n "${DENSE_FLAGS:-}" ]]; then
			read -r -a place <<<"$DENSE_FLAGS"
		elif [[ $mode == limit ]]; then
			place=(--units "neon{repack=0,threads=$THREADS}")
		else
			place=(--backend neon -t "$THREADS")
		fi
		has_sparse_flag && place+=(--sparse off)
		measure "$mode" "$round" dense "$MODEL" parse_xpu "$XPU" run --model "$MODEL" "${place[@]}" \
			"${xpu_common[@]}" --stats "${XPU_EXTRA[@]}"
		;;
	sparse)
		local place
		if [[ -n "${SPARSE_FLAGS:-}" ]]; then
			read -r -a place <<<"$SPARSE_FLAGS"
		elif [[ $mode == limit ]]; then
			place=(--units "neon{repack=0,threads=$THREADS}")
		else
			place=(--backend neon -t "$THREADS")
		fi
		[[ $mode == free && ${FREE_BUDGET:-8GiB} != plan ]] && place+=(--budget "${FREE_BUDGET:-8GiB}")
		if [[ $mode == limit && ${LIMIT_BUDGET:-auto} != plan && " ${place[*]} " != *" --budget "* ]]; then
			local lb=${LIMIT_BUDGET:-auto}
			[[ $lb == auto ]] && lb="$((LIMIT / 1048576 - PROCESS_MIB))MiB"
			place+=(--budget "$lb")
		fi
		measure "$mode" "$round" sparse "$MODEL" parse_xpu "$XPU" run --model "$MODEL" --sparse on "${place[@]}" \
			"${xpu_common[@]}" --stats "${XPU_EXTRA[@]}"
		;;
	esac
}

echo "sparse-7b: out $OUT; model $MODEL ($model_bytes bytes); limit $LIMIT bytes ($((LIMIT / 1048576)) MiB); configs ${configs[*]}; modes ${modes[*]}; N=$N, THREADS=$THREADS (llama.cpp $LLAMA_THREADS), ROUNDS=$ROUNDS" >&2
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "machine: $(machine)" >&2
run_round() { run_config "$mode" "$@"; }
for mode in "${modes[@]}"; do
	if [[ $mode == limit ]]; then
		cgroup_limit "$LIMIT"
	else
		cgroup_limit -1
		# warm caches: each model file read once, outside the group
		for f in "$MODEL" $(want llama && echo "$TWIN"); do cat "$f" >/dev/null; done
	fi
	interleave "$ROUNDS" run_round "${configs[@]}"
done
cgroup_limit -1
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

echo
echo "Load average before: $load_start; after: $load_end. Limit: $LIMIT bytes ($((LIMIT / 1048576)) MiB) in $CGROUP; N=$N, THREADS=$THREADS (llama.cpp $LLAMA_THREADS), ROUNDS=$ROUNDS."
echo
table "$results"
echo
echo "(results: $results; per-run logs in $OUT)"
