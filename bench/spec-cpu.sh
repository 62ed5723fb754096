#!/usr/bin/env bash
# Speculative decoding on a loaded machine: CPU time per generated token instead of wall time.
# Wall-clock tok/s swings by 2-4x when other processes share the cores; the process's own CPU
# time (user + system) moves much less. Each configuration runs once per round, and the figure
# is the CPU time of decoding alone per decoded token, as `xpu run --stats` prints it ("decode
# cpu:", measured around the decode loop: load, prefill and calibration are not in it; an
# earlier version took the difference of an N-token and a 1-token run, into which calibration's
# run-to-run spread leaked). Rounds interleave the configurations; the table has medians and each
# configuration's ratio to plain decoding of the same round.
#
#   bench/spec-cpu.sh                  (after `make all`; same task as bench/spec.sh)
#
# Settings: XPU, MODEL, N (200), ROUNDS (5), THREADS (1), STORY_BYTES (500), BACKEND (neon),
# XPU_PLUGIN_PATH (the plugin build, as for xpu itself).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
XPU=${XPU:-build/xpu}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
BACKEND=${BACKEND:-neon}
N=${N:-200}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-1}
STORY_BYTES=${STORY_BYTES:-500}
story=$(head -c "$STORY_BYTES" "$(dirname "$MODEL")/stories260K.greedy.txt" | tr '\n' ' ')
prompt="$story $story"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export XPU_CACHE_DIR="$out/cache"

# cpu NAME N FLAGS...: the decode CPU µs per token of one run ("decode cpu:" of --stats)
cpu() {
	local n=$2
	shift 2
	"$XPU" run --model "$MODEL" --backend "$BACKEND" -t "$THREADS" --temp 0 -n "$n" --stats -p "$prompt" "$@" \
		>"$out/o.txt" 2>"$out/o.err"
	sed -n 's/^decode cpu: .* ms, \([0-9.]*\) µs per token.*/\1/p' "$out/o.err"
}

# CONFIGS: the configurations, plain first; a name other than these four takes its flags from
# FLAGS_<name> (dashes as underscores), e.g. CONFIGS="plain auto auto4" FLAGS_auto4="--spec-lengths 4,8".
# other-history: the default policy with a task history of answers to other prompts only
# (bench/spec-history.sh), put back before every run.
read -r -a configs <<<"${CONFIGS:-plain auto retrieval-always other-history}"
# shellcheck source=bench/spec-history.sh
source "$(dirname "$0")/spec-history.sh"
if [[ " ${configs[*]} " == *" other-history "* ]]; then fill_other; fi
flags() {
	case $1 in
	plain) echo "--spec off" ;;
	auto) echo "" ;;
	retrieval-always) echo "--spec retrieval --spec-always" ;;
	other-history) echo "--spec-task other" ;;
	*)
		local v="FLAGS_${1//-/_}"
		echo "${!v:-}"
		;;
	esac
}
: >"$out/results"
echo "machine: $(machine)" >&2
one() {
	local r=$1 c=$2 us tpp load
	load=$(load1)
	if [[ $c == other-history ]]; then restore_other; fi
	# shellcheck disable=SC2046
	us=$(cpu "$c" "$N" $(flags "$c"))
	[ -n "$us" ] || { echo "$c: no \"decode cpu:\" line in --stats:" >&2; cat "$out/o.err" >&2; exit 1; }
	tpp=$(sed -n 's/^speculative: \([0-9.]*\) tokens\/pass.*/\1/p' "$out/o.err")
	cp "$out/o.txt" "$out/$c.txt"
	echo "$r $c $us ${tpp:-1.00} $load" >>"$out/results"
}
interleave "$ROUNDS" one "${configs[@]}"
for c in "${configs[@]:1}"; do
	cmp -s "$out/plain.txt" "$out/$c.txt" || echo "WARNING: $c's text differs from plain decoding's" >&2
done
echo "| configuration | CPU µs per token | × plain (tokens per CPU second) | tokens/pass | load avg |"
echo "|---|--:|--:|--:|--:|"
python3 - "$out/results" "${configs[@]}" <<'PY'
import sys, statistics as st, collections
per, rows, order = {}, collections.defaultdict(list), []
for line in open(sys.argv[1]):
    r, c, us, tpp, load = line.split()
    us = float(us)
    per[(r, c)] = us
    rows[c].append((us, float(tpp), float(load)))
    if c not in order:
        order.append(c)
for c in sys.argv[2:]:
    if c not in rows:
        continue
    ratios = [per[(r, "plain")] / per[(r, c)] for (r, cc) in per if cc == c and (r, "plain") in per and per[(r, c)] > 0]
    v = rows[c]
    print("| %s | %.0f | %.2f | %.2f | %.1f |" % (c, st.median(x[0] for x in v), st.median(ratios),
          st.median(x[1] for x in v), st.median(x[2] for x in v)))
PY
