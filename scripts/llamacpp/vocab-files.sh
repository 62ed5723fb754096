#!/usr/bin/env bash
# Copies llama.cpp's tokenizer test files (models/ggml-vocab-*.gguf and their .inp/.out) out of
# a llama.cpp git repository (a bare mirror will do) into OUT, for
#   XPU_LLAMA_VOCAB_DIR=OUT go test -run TestLlamaCppVocabFiles ./llm/tokenizer/
# (make llamacpp-check LLAMA_VOCAB_DIR=OUT). The files stay outside this repository. A blob the
# repository lacks (a partial clone) is reported and skipped.
#
#   scripts/llamacpp/vocab-files.sh LLAMA_GIT_DIR OUT [REV]
set -euo pipefail

git_dir=${1:?usage: scripts/llamacpp/vocab-files.sh LLAMA_GIT_DIR OUT [REV]}
out=${2:?usage: scripts/llamacpp/vocab-files.sh LLAMA_GIT_DIR OUT [REV]}
rev=${3:-HEAD}
mkdir -p "$out"
n=0
while read -r _ _ blob path; do
  if git --git-dir="$git_dir" cat-file -e "$blob" 2>/dev/null; then
    git --git-dir="$git_dir" cat-file blob "$blob" > "$out/$(basename "$path")"
    n=$((n + 1))
  else
    echo "vocab-files: $path is not in $git_dir (partial clone?): skipped" >&2
  fi
done < <(git --git-dir="$git_dir" ls-tree "$rev" models/ | grep 'ggml-vocab-')
echo "vocab-files: $n files from $(git --git-dir="$git_dir" rev-parse "$rev") in $out"
