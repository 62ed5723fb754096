#!/usr/bin/env bash
# Pre-tokenizer speed: the hand-written steps against the published regexes on regexp2,
# in interleaved rounds (one run of each case per round, so load changes hit both alike), and
# the median MB/s of each case with the hand/regexp2 ratio. Usage: bench/tokenizer.sh [ROUNDS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
rounds=${1:-5}
bin=$(mktemp -d)/tokenizer.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" ./llm/tokenizer
cases=(PreTokenize/llama-bpe/hand PreTokenize/llama-bpe/regexp2 PreTokenize/qwen2/hand PreTokenize/qwen2/regexp2
       PreTokenize/gpt-2/hand PreTokenize/gpt-2/regexp2 PreTokenize/starcoder/hand PreTokenize/starcoder/regexp2
       PreTokenize/falcon/hand PreTokenize/falcon/regexp2 PreTokenize/deepseek-v3/regexp2
       PreTokenize/deepseek-llm/regexp2 PreTokenize/gpt-4o/regexp2 EncodeBPE/llama-bpe/hand EncodeBPE/llama-bpe/regexp2)
echo "machine: $(machine)"
load_line before
out=$(for r in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    "$bin" -test.run '^$' -test.bench "^Benchmark${c%%/*}\$/^${c#*/}\$" -test.benchtime 20x | grep '^Benchmark' || true
  done
done)
load_line after
# median per case (sort by case then value; the middle of each group), then hand/regexp2 ratios
echo "$out" | awk '{ n=$1; sub(/-[0-9]+$/, "", n); print n, $(NF-1) }' | sort -k1,1 -k2,2g |
awk '{ if ($1 != cur) { flush(); cur=$1; k=0 } a[++k]=$2 }
  function flush() { if (k) { m=(k%2 ? a[(k+1)/2] : (a[k/2]+a[k/2+1])/2); med[cur]=m; order[++no]=cur;
    printf "%-46s %8.2f MB/s (median of %d)\n", cur, m, k } }
  END { flush(); for (i=1; i<=no; i++) { n=order[i]; if (n ~ /\/hand$/) { r=n; sub(/hand$/, "regexp2", r);
    if (r in med) printf "%-46s %8.1fx\n", "hand/regexp2 " n, med[n]/med[r] } } }'
