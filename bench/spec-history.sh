# shellcheck shell=bash
# Sourced by bench/spec.sh and bench/spec-cpu.sh: a task history (CoordGen's per-task store of
# earlier answers, `xpu run --spec-task`) filled with the model's answers to OTHER prompts of
# the same kind, never to the measured prompt. fill_other runs them once, untimed, and keeps a
# copy of the store; restore_other puts that copy back before every measured run, so the
# measured prompt's own answer never becomes a drafting source (a measured run appends it).
#
# llama.cpp's counterpart is llama-lookup's dynamic n-gram cache (-lcd), which generation
# updates: fill_other_llama answers the same prompts into it, restore_other_llama puts it back.
#
# Needs XPU, MODEL, BACKEND, THREADS, out (a scratch folder) and XPU_CACHE_DIR set (and
# LLAMA_BIN for the llama functions).
# OTHER_N: how many of OTHER_PROMPTS to answer (default all 6), 200 tokens each.
OTHER_PROMPTS=(
	"Once upon a time, there was a boy named Tom. He liked to run in the garden."
	"One day, a little cat found a red ball under a big tree."
	"Sara had a big dog. The dog liked to play with her every day."
	"Ben and Mia went to the park with their mom and dad."
	"There was a bird who could not fly. The bird was very sad."
	"Max wanted to build a tall tower with his blocks."
)

# fill_other: the store of task "other", from OTHER_N answers; its copy in $out/other-store
fill_other() {
	local p
	for p in "${OTHER_PROMPTS[@]:0:${OTHER_N:-${#OTHER_PROMPTS[@]}}}"; do
		"$XPU" run --model "$MODEL" --backend "$BACKEND" -t "$THREADS" --temp 0 -n 200 --spec-task other -p "$p" \
			>/dev/null 2>"$out/fill.err" || {
			cat "$out/fill.err" >&2
			return 1
		}
	done
	rm -rf "$out/other-store"
	cp -a "$XPU_CACHE_DIR/spec" "$out/other-store"
}

# restore_other: the store as fill_other left it
restore_other() {
	rm -rf "$XPU_CACHE_DIR/spec"
	cp -a "$out/other-store" "$XPU_CACHE_DIR/spec"
}

# fill_other_llama: llama-lookup's dynamic cache from the same answers, copied to $out/other.lcd
fill_other_llama() {
	local p
	rm -f "$out/live.lcd"
	for p in "${OTHER_PROMPTS[@]:0:${OTHER_N:-${#OTHER_PROMPTS[@]}}}"; do
		"$LLAMA_BIN/llama-lookup" -m "$MODEL" -n 200 -t "$THREADS" --temp 0 -lcd "$out/live.lcd" -p "$p" \
			>"$out/fill.err" 2>&1 || {
			cat "$out/fill.err" >&2
			return 1
		}
	done
	cp "$out/live.lcd" "$out/other.lcd"
}

# restore_other_llama: the cache as fill_other_llama left it, in $out/live.lcd
restore_other_llama() { cp "$out/other.lcd" "$out/live.lcd"; }
