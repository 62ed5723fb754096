#!/usr/bin/env bash
# Offline cost of the sparse FFN pipeline (issue 18): write the synthetic ~7B ReLU model and its
# SiLU twin, then plan the sidecar for a budget of half the model minus the process's needs.
# Usage: bench/sparse-offline.sh [DIR] (default /tmp/sp7b). Run on a quiet machine; prints the
# load before and after, and each step's wall and CPU time.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
dir=${1:-/tmp/sp7b}
xpu=${XPU:-build/xpu}
mkdir -p "$dir"
t() { load_line; /usr/bin/time -f "%e s wall, %U s user, %M KiB max RSS" "$@"; }
t "$xpu" gen-model --params 7B --type q4_0 --act relu --sparsity 0.9 --skew zipf --seed 1 --measure 16 -o "$dir/relu-q4_0.gguf"
t "$xpu" gen-model --params 7B --type q4_0 --act silu --sparsity 0.9 --skew zipf --seed 1 --measure 0 -o "$dir/silu-q4_0.gguf"
t "$xpu" plan-sparse --model "$dir/relu-q4_0.gguf" --budget 1580MiB --ctx 256 --kv-type f16 --tokens 128 -o "$dir/relu-q4_0.gguf.sparse.gguf"
echo "machine: $(machine)"
load_line
