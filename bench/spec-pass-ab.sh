#!/usr/bin/env bash
# Per-pass A/B of neon plugin builds: BenchmarkVerifyPass (decode and each verify length at
# cache positions 64 and 480, stories260K, 1 thread) run once per build per round, the builds
# interleaved; per case the median and, in parentheses, the minimum over the rounds of the
# process's CPU time per pass in µs (on a loaded machine the minimum is the least disturbed).
#
#   bench/spec-pass-ab.sh DIR_A DIR_B...   (each a folder of libxpu-neon*.so, as XPU_PLUGIN_PATH)
#
# Settings: ROUNDS (5), BENCHTIME (300x), FILTER (a VerifyPass sub-benchmark pattern, e.g.
# 'pos=480/len=(1|8)$').
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
BENCHTIME=${BENCHTIME:-300x}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go test -c -o "$out/spec.test" ./llm/spec
for ((r = 0; r < ROUNDS; r++)); do
	for dir in "$@"; do
		(cd llm/spec && XPU_PLUGIN_PATH=$dir "$out/spec.test" -test.run X -test.bench "VerifyPass/${FILTER:-}" \
			-test.benchtime "$BENCHTIME") | awk -v d="$dir" '/cpu-ns/ {print d, $1, $5}'
	done
done >"$out/results"
python3 - "$out/results" "$@" <<'PY'
import sys, collections, statistics as st
v, order = collections.defaultdict(list), []
for line in open(sys.argv[1]):
    d, b, c = line.split()
    b = b.replace("BenchmarkVerifyPass/", "").rsplit("-", 1)[0]
    v[(b, d)].append(float(c) / 1000)
    if b not in order:
        order.append(b)
dirs = sys.argv[2:]
print("| case | " + " | ".join(dirs) + " |")
print("|---|" + "--:|" * len(dirs))
for b in order:
    print("| %s | %s |" % (b, " | ".join("%.0f (%.0f)" % (st.median(v[(b, d)]), min(v[(b, d)])) for d in dirs)))
PY
echo "machine: $(machine)"
load_line
