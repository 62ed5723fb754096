#!/usr/bin/env bash
# A/B of two neon plugin builds on the summary task of bench/spec.sh (stories260K, 1 thread,
# greedy, 200 tokens): plain decoding and --spec retrieval --spec-always, interleaved rounds.
#
#   bench/spec-ab.sh DIR_A DIR_B     (each a folder of libxpu-neon*.so, as XPU_PLUGIN_PATH)
#
# Prints per configuration the decode tok/s of every round, sorted (the middle one is the
# median), and the output's hash per round (the same hash everywhere: the same text).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
XPU=${XPU:-build/xpu}
MODEL=${MODEL:-../shared/models/stories260K.gguf}
ROUNDS=${ROUNDS:-5}
story=$(head -c 500 "$(dirname "$MODEL")/stories260K.greedy.txt" | tr '\n' ' ')
prompt="$story $story"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for _ in $(seq "$ROUNDS"); do
	for v in A B; do
		dir=$1
		[[ $v == B ]] && dir=$2
		for s in off retrieval; do
			extra=()
			[[ $s == retrieval ]] && extra=(--spec-always)
			XPU_PLUGIN_PATH=$dir "$XPU" run --model "$MODEL" --backend neon -t 1 --temp 0 -n 200 --stats \
				-p "$prompt" --spec "$s" "${extra[@]}" >"$out/o.txt" 2>"$out/o.err"
			echo "$v $s $(sed -n 's/^decode: .* \([0-9.]*\) tok\/s.*/\1/p' "$out/o.err") $(md5sum <"$out/o.txt" | cut -c1-8)"
		done
	done
done | sort -k1,2 -k3n | awk '{k = $1 " " $2; v[k] = v[k] " " $3; h[k] = h[k] " " $4}
	END {for (k in v) print k ":" v[k] " |" h[k]}' | sort
echo "machine: $(machine)"
load_line
