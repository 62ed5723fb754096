#!/usr/bin/env bash
# W8A8 with shadow outliers (issue 16): teacher-forced logits NMSE against the F32 model of
# per-tensor W8A8 without shadow, with shadow, with shadow + pruning, and Q8_0 on neon, on
# stories260K and on a synthetic Qwen2 with planted activation outliers; for stories260K also
# greedy text from BOS with each W8A8 variant on the units (default: the emulated NPU for the
# int8 work, neon for the rest and the shadow path) against F32 on ref: how many of the first
# N tokens match.
#
#   bench/w8a8.sh
#
# Each model is calibrated first (xpu calibrate, on ref, the built-in text; the evaluation
# text is another built-in text). Accuracy figures do not depend on the machine's load.
#
# Settings, from the environment:
#   XPU      the xpu binary (default build/xpu)
#   STORIES  default ../shared/models/stories260K.gguf ("none" leaves it out)
#   QWEN     the outlier model (default build/models/qwen2-15m-outliers.gguf, written by
#            `xpu gen-model --arch qwen2 --params 15M --type f32 --outliers 4` when absent)
#   UNITS    units of the W8A8 runs (default qnn,neon; "ref" runs them on the reference)
#   TOKENS   evaluation tokens (default 128)         N  greedy tokens compared (default 64)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

XPU=${XPU:-build/xpu}
STORIES=${STORIES:-../shared/models/stories260K.gguf}
QWEN=${QWEN:-build/models/qwen2-15m-outliers.gguf}
UNITS=${UNITS:-qnn,neon}
TOKENS=${TOKENS:-128}
N=${N:-64}
export XPU_CACHE_DIR=${XPU_CACHE_DIR:-$(mktemp -d)}

if [ ! -f "$QWEN" ]; then
  mkdir -p "$(dirname "$QWEN")"
  "$XPU" gen-model --arch qwen2 --params 15M --type f32 --outliers 4 -o "$QWEN"
fi
unitflag=()
[ "$UNITS" != ref ] && unitflag=(--units "$UNITS")

load_line
for m in "$STORIES" "$QWEN"; do
  [ "$m" = none ] && continue
  echo "== $m"
  "$XPU" calibrate "$m"
  greedy=0; [ "$m" = "$STORIES" ] && greedy=$N
  "$XPU" w8a8-eval "$m" --tokens "$TOKENS" --greedy "$greedy" "${unitflag[@]}"
done

