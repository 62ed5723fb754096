#!/usr/bin/env bash
# Regenerates the llama.cpp golden files that `make test` checks xpu against (not run by make
# test): llama-quantize's tensors of a small synthetic model for every xpu quantization recipe
# (cmd/xpu/testdata/llamacpp/quantize.json, SHA-256 per tensor) and llama-tokenize's ids of the
# tokenizer test texts for every vocabulary and pre-tokenizer family, and a small BERT WordPiece one
# (llm/tokenizer/testdata/llamacpp_ids.json). Only llama.cpp's outputs are kept, none of its code.
#
#   scripts/llamacpp-goldens.sh LLAMA_BIN [LLAMA_CPP_COMMIT]
#
# LLAMA_BIN is a llama.cpp build's bin folder holding llama-quantize and llama-tokenize, e.g.
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
#   cmake --build build -j2 --target llama-quantize llama-tokenize
# LLAMA_CPP_COMMIT (default: the git HEAD of LLAMA_BIN/../.., if it is a checkout) is recorded in
# the files. The tokenizer vocabularies come from build/npm (scripts/deps.sh installs them).
set -euo pipefail

bin=${1:?usage: scripts/llamacpp-goldens.sh LLAMA_BIN [LLAMA_CPP_COMMIT]}
bin=$(cd "$bin" && pwd)
for tool in llama-quantize llama-tokenize; do
  [ -x "$bin/$tool" ] || { echo "llamacpp-goldens: $bin/$tool not found" >&2; exit 2; }
done
commit=${2:-$(git -C "$bin/../.." rev-parse HEAD 2>/dev/null || echo unknown)}
cd "$(dirname "$0")/.."

export LLAMA_CPP_COMMIT=$commit XPU_LLAMACPP_GOLDEN=update
LLAMA_BIN=$bin go test -count=1 -run '^TestQuantizeMatchesLlamaCppGoldens$' ./cmd/xpu/
XPU_LLAMA_TOKENIZE=$bin/llama-tokenize go test -count=1 -run '^TestAgainstLlamaCpp$' ./llm/tokenizer/
unset XPU_LLAMACPP_GOLDEN
# the new goldens must pass as make test runs them
go test -count=1 -run '^TestQuantizeMatchesLlamaCppGoldens$' ./cmd/xpu/
go test -count=1 -run '^TestAgainstLlamaCpp$' ./llm/tokenizer/
git status --short cmd/xpu/testdata/llamacpp llm/tokenizer/testdata/llamacpp_ids.json
