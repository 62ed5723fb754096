#!/usr/bin/env bash
# Builds scripts/llamacpp/logits.c against a llama.cpp build: the llama.h of its source tree and
# its libllama. Works for upstream llama.cpp (libraries in build/bin) and ik_llama.cpp
# (libraries in build/src and build/ggml/src).
#
#   scripts/llamacpp/build-logits.sh LLAMA_BIN OUT [LLAMA_SRC]
#
# LLAMA_BIN is the build's bin folder; LLAMA_SRC (default LLAMA_BIN/../..) the source tree
# holding include/llama.h and ggml/include/ggml.h.
set -euo pipefail

bin=${1:?usage: scripts/llamacpp/build-logits.sh LLAMA_BIN OUT [LLAMA_SRC]}
out=${2:?usage: scripts/llamacpp/build-logits.sh LLAMA_BIN OUT [LLAMA_SRC]}
bin=$(cd "$bin" && pwd)
src=$(cd "${3:-$bin/../..}" && pwd)
for h in include/llama.h ggml/include/ggml.h; do
  [ -f "$src/$h" ] || { echo "build-logits: $src/$h not found (pass the llama.cpp source tree as LLAMA_SRC)" >&2; exit 2; }
done
lib=$(find "$bin" "$bin/.." -maxdepth 3 -name 'libllama.so' -print -quit 2>/dev/null || true)
[ -n "$lib" ] || { echo "build-logits: no libllama.so under $bin or $bin/.. (build llama.cpp with -DBUILD_SHARED_LIBS=ON)" >&2; exit 2; }
libdir=$(dirname "$lib")
# The tensor dump (-d) calls ggml itself: upstream keeps those calls in libggml-base,
# ik_llama.cpp in libggml.
ggml=$(find "$bin" "$bin/.." -maxdepth 4 \( -name 'libggml-base.so' -o -name 'libggml.so' \) -print 2>/dev/null | sort | head -n 1 || true)
[ -n "$ggml" ] || { echo "build-logits: no libggml-base.so or libggml.so under $bin or $bin/.." >&2; exit 2; }
ggmldir=$(dirname "$ggml")
ggmllib=$(basename "$ggml" .so)
here=$(dirname "$0")
mkdir -p "$(dirname "$out")"
# libllama's own RUNPATH finds libggml in the build tree; the rpath here finds libllama.
${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -I"$src/include" -I"$src/ggml/include" \
  "$here/logits.c" -o "$out" -L"$libdir" -lllama -L"$ggmldir" -l"${ggmllib#lib}" \
  -Wl,-rpath,"$libdir" -Wl,-rpath,"$ggmldir" -lm
echo "build-logits: $out (llama.h from $src, libllama from $libdir)"
