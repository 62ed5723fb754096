# xpu build. `make` builds the CLI and every plugin; `make test` installs what is missing and
# runs everything CI runs; `make demo` runs the main job. Each plugin adds itself through
# plugins/<name>/plugin.mk (it appends its .so to PLUGINS and its checks to PLUGIN_TESTS).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

BUILD      ?= build
PLUGIN_DIR := $(BUILD)/plugins
GO         ?= go
CC         ?= gcc
CC_ARM64   ?= aarch64-linux-gnu-gcc
PLUGIN_CFLAGS := -std=c11 -O2 -g -fPIC -Wall -Wextra -Werror -fvisibility=hidden \
                 -Iabi -Iplugins/common -D_GNU_SOURCE
PLUGIN_LDFLAGS := -shared -lpthread -ldl -lm
COMMON_HDRS := abi/xpu_backend.h abi/xpu_ir.h abi/xpu_validate.h plugins/common/xpu_plugin.h plugins/common/xpu_sync.h

# the plugin.mk files below define rules of their own: without this, plain `make` would build
# only the first of them (one plugin) instead of the CLI and every plugin
.DEFAULT_GOAL := all

PLUGINS :=
PLUGIN_TESTS :=
include $(sort $(wildcard plugins/*/plugin.mk))

.PHONY: all plugins cli deps demo test test-go test-conform test-coreml test-arm64 vet clean
all: plugins cli

plugins: $(PLUGINS)

cli:
	$(GO) build -ldflags "-X main.commit=$$(git rev-parse HEAD 2>/dev/null)" -o $(BUILD)/xpu ./cmd/xpu

deps:
	@bash scripts/deps.sh

demo: deps all
	$(BUILD)/xpu demo

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./...

test-go: all
	$(GO) test -race -count=1 ./...

# The allocation tests (testing.AllocsPerRun, named *Allocs) skip under -race, which allocates
# by itself, so test-go never runs them: they get a pass of their own without -race, only those
# tests in only the packages that have one.
ALLOC_TEST_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' --exclude-dir=build --exclude-dir=.git 'AllocsPerRun' .)))
.PHONY: test-allocs
test-allocs:
	@test -n "$(ALLOC_TEST_PKGS)" || { echo "test-allocs: no AllocsPerRun test found" >&2; exit 1; }
	$(GO) test -count=1 -run 'Allocs$$' $(ALLOC_TEST_PKGS)

test-conform: all
	@mkdir -p $(BUILD)/conformance
	$(BUILD)/xpu conform --all --report $(BUILD)/conformance

# docs/ops.md: the op x dtype coverage matrix of every in-tree backend (neon, opencl via PoCL,
# the QNN emulator, the Core ML emulator, ref); TestOpsDocIsCurrent fails when it is stale.
.PHONY: ops-doc
ops-doc: all
	$(BUILD)/xpu conform --ops-doc docs/ops.md

# The coreml backend through the emulated Core ML runtime (plugins/coreml/README.md): the whole
# suite, with reports saying "coreml (emulated runtime)", and the test model's greedy text.
test-coreml: cli
	@mkdir -p $(BUILD)/conformance
	$(BUILD)/xpu conform --plugin coreml --report $(BUILD)/conformance
	@if [ -f ../shared/models/stories260K.gguf ]; then \
	  $(BUILD)/xpu run --model ../shared/models/stories260K.gguf --temp 0 -n 256 --backend coreml 2>/dev/null \
	    | cmp - ../shared/models/stories260K.greedy.txt && echo "coreml: greedy text equals the sample"; \
	else echo "coreml: ../shared/models absent, greedy check skipped"; fi

# On CI every backend this machine is set up for must be found: a plugin that is not built or
# probes 0 (no OpenCL ICD) fails the Go tests and `xpu conform --all` instead of skipping them.
# Override with XPU_REQUIRE_BACKENDS= (none) or another list where a backend cannot run.
test: export XPU_REQUIRE_BACKENDS ?= neon,opencl,qnn
test: deps vet all $(PLUGIN_TESTS) test-fuzz-ir test-fuzz-plugins test-go test-allocs test-conform test-coreml test-arm64
	@echo "make test: all checks passed"

# libFuzzer on the C IR reader (abi/xpu_ir.h) under ASan + UBSan. `make fuzz-ir` runs for
# FUZZ_SECONDS (default 600); `make test` runs it for 60 s. The corpus grows in build/fuzz and
# is reused by the next run; a finding is written there as crash-* and fails the target.
FUZZ_SECONDS ?= 600
FUZZ_CC ?= clang
IR_FUZZ := $(BUILD)/fuzz/ir_fuzz
.PHONY: fuzz-ir test-fuzz-ir bench-ir
$(IR_FUZZ): abi/fuzz/ir_fuzz.c abi/xpu_ir.h abi/xpu_backend.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -g -O1 -Wall -Wextra -Werror -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -Iabi -o $@ $<

fuzz-ir: $(IR_FUZZ)
	@mkdir -p $(BUILD)/fuzz/ir-corpus
	$(IR_FUZZ) -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	  -artifact_prefix=$(BUILD)/fuzz/ $(BUILD)/fuzz/ir-corpus 2>&1 | grep -v '^#' | tail -25; \
	  test $${PIPESTATUS[0]} -eq 0

test-fuzz-ir:
	$(MAKE) --no-print-directory fuzz-ir FUZZ_SECONDS=60

# libFuzzer on each plugin whole (abi/fuzz/plugin_fuzz.c linked with the plugin's sources, all
# under ASan + UBSan): random IR through graph_analyze -> graph_prepare -> execution -> release.
# `make fuzz-plugins` runs each for FUZZ_SECONDS (default 600); `make test` runs the three at
# once for 60 s (test-fuzz-plugins), so the wall cost is one minute, not three. Corpora grow in
# build/fuzz/<plugin>-corpus; a finding is written to build/fuzz as <plugin>-crash-* (or
# -timeout-*, -leak-*) and fails the target. abi/fuzz/seeds/<plugin> holds every earlier finding
# (and a MATMUL without inputs), run first each time: a fixed bug that comes back fails at once.
# OpenCL runs on PoCL (leak checks off: PoCL and LLVM keep allocations to exit); qnn on the
# emulator, built with the same sanitizers. No -Werror: the plugins are -Werror clean under gcc,
# their own compiler; clang warns about a few things gcc does not.
PLUGIN_FUZZ_FLAGS := -std=c11 -g -O1 -Wall -Wextra -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=all -fno-omit-frame-pointer -Iabi -Iplugins/common -D_GNU_SOURCE
PLUGIN_FUZZERS := $(BUILD)/fuzz/neon/plugin_fuzz $(BUILD)/fuzz/opencl/plugin_fuzz $(BUILD)/fuzz/qnn/plugin_fuzz
.PHONY: fuzz-plugins test-fuzz-plugins
$(BUILD)/fuzz/neon/plugin_fuzz: abi/fuzz/plugin_fuzz.c $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(PLUGIN_FUZZ_FLAGS) -DNV_VARIANT='"portable"' -o $@ $< $(NEON_SRCS) $(NEON_PROBE) -lpthread -ldl -lm
$(BUILD)/fuzz/opencl/plugin_fuzz: abi/fuzz/plugin_fuzz.c $(OPENCL_SRCS) $(OPENCL_HDRS) $(OPENCL_GEN) $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(PLUGIN_FUZZ_FLAGS) -I$(dir $(OPENCL_GEN)) -o $@ $< $(OPENCL_SRCS) -lpthread -ldl -lm
$(BUILD)/fuzz/qnn/libQnnXpuEmu.so: $(QNN_EMU_SRCS) $(QNN_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -g -O1 -fPIC -shared -Wall -Wextra -Werror -fsanitize=address,undefined \
	  -fno-sanitize-recover=all -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $(QNN_EMU_SRCS) -lpthread -lm
$(BUILD)/fuzz/qnn/plugin_fuzz: abi/fuzz/plugin_fuzz.c $(QNN_SRCS) $(QNN_HDRS) $(COMMON_HDRS) abi/xpu_ir_build.h $(BUILD)/fuzz/qnn/libQnnXpuEmu.so
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(PLUGIN_FUZZ_FLAGS) -DXPU_QNN_BUILD_ID='"fuzz"' -o $@ $< $(QNN_SRCS) -lpthread -ldl -lm

# one fuzzer per plugin, all at once; each prints its last lines and the recipe fails if any did
fuzz-plugins: $(PLUGIN_FUZZERS)
	@set -o pipefail; pids=; for p in neon opencl qnn; do \
	  mkdir -p $(BUILD)/fuzz/$$p-corpus; \
	  ( ASAN_OPTIONS=detect_leaks=$$([ $$p = opencl ] && echo 0 || echo 1) XPU_CACHE_DIR=$(BUILD)/fuzz/$$p-cache \
	    XPU_FUZZ_PLUGIN_DIR=$(BUILD)/fuzz/$$p XPU_QNN_LIBRARY=$(BUILD)/fuzz/qnn/libQnnXpuEmu.so \
	    $(BUILD)/fuzz/$$p/plugin_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=3072 \
	      -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$p- $(BUILD)/fuzz/$$p-corpus abi/fuzz/seeds/$$p \
	      > $(BUILD)/fuzz/$$p.log 2>&1; rc=$$?; \
	    echo "== fuzz $$p: exit $$rc"; grep -v '^#' $(BUILD)/fuzz/$$p.log | tail -20; exit $$rc ) & pids="$$pids $$!"; \
	done; fail=0; for pid in $$pids; do wait $$pid || fail=1; done; exit $$fail

test-fuzz-plugins:
	$(MAKE) --no-print-directory fuzz-plugins FUZZ_SECONDS=60

# xpu_ir_parse's time on a chain of N nodes (linear in N)
bench-ir:
	@mkdir -p $(BUILD)/bench
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Iabi -o $(BUILD)/bench/ir_parse_bench abi/fuzz/ir_parse_bench.c
	$(BUILD)/bench/ir_parse_bench 1000 10000 100000

clean:
	rm -rf $(BUILD)

# The backend SDK a plugin outside this repository builds against (`xpu backend new` writes a
# Makefile that uses it): every ABI header (abi/*.h, so a header added there ships without a
# change here), the header-only helpers of plugins/common (handle registry, timeline fences),
# OPS.md, and xpu-backend.pc for pkg-config. PREFIX is required; a relative one is made absolute.
SDK_HDRS := $(sort $(wildcard abi/*.h)) plugins/common/xpu_plugin.h plugins/common/xpu_sync.h
XPU_ABI_VERSION = $(shell sed -n 's/^\#define XPU_ABI_MAJOR \([0-9]*\)u.*/\1/p' abi/xpu_backend.h).$(shell sed -n 's/^\#define XPU_ABI_MINOR \([0-9]*\)u.*/\1/p' abi/xpu_backend.h)
.PHONY: install-sdk
install-sdk:
	@test -n "$(PREFIX)" || { echo "make install-sdk: set PREFIX (e.g. PREFIX=$$HOME/.local)" >&2; exit 2; }
	@prefix="$(abspath $(PREFIX))"; \
	  install -d "$$prefix/include/xpu" "$$prefix/lib/pkgconfig" "$$prefix/share/doc/xpu-backend" && \
	  install -m 644 $(SDK_HDRS) "$$prefix/include/xpu/" && \
	  install -m 644 abi/OPS.md "$$prefix/share/doc/xpu-backend/" && \
	  printf '%s\n' "prefix=$$prefix" 'includedir=$${prefix}/include' '' \
	    'Name: xpu-backend' 'Description: headers for writing an xpu backend plugin (ABI, IR reader, helpers)' \
	    'Version: $(XPU_ABI_VERSION)' 'Cflags: -I$${includedir}/xpu' 'Libs: -lpthread -lm' \
	    > "$$prefix/lib/pkgconfig/xpu-backend.pc" && \
	  echo "installed the xpu backend SDK in $$prefix (pkg-config: PKG_CONFIG_PATH=$$prefix/lib/pkgconfig pkg-config --cflags xpu-backend)"

# xpu against llama.cpp: every architecture gen-model writes loads in llama.cpp with the same
# greedy tokens and logits as in xpu (scripts/llamacpp/logits.c, built here against the llama.h
# of LLAMA_SRC, default LLAMA_BIN/../..; upstream llama.cpp or ik_llama.cpp), our Q4_K_M bytes
# equal llama-quantize's on a synthetic model, and llama.cpp's greedy text on our stories260K
# Q4_K_M file equals xpu's. Needs LLAMA_BIN (a llama.cpp build's bin folder; the checks whose
# tool, llama-quantize or llama-simple, it lacks are skipped) and ../shared/models; not in make test.
# With LLAMA_VOCAB_DIR (llama.cpp's models/ggml-vocab-* files, scripts/llamacpp/vocab-files.sh
# copies them out of a llama.cpp git repository) the tokenizers are checked on llama.cpp's own
# tokenizer tests, and with llama-tokenize on the vocabularies it ships without tests.
.PHONY: llamacpp-check
llamacpp-check:
	@test -n "$(LLAMA_BIN)" || { echo "make llamacpp-check: set LLAMA_BIN to a llama.cpp build's bin folder (libllama.so, llama-quantize, llama-simple)" >&2; exit 2; }
	bash scripts/llamacpp/build-logits.sh "$(LLAMA_BIN)" "$(abspath $(BUILD))/llamacpp-logits" $(LLAMA_SRC)
	LLAMA_BIN="$(LLAMA_BIN)" LLAMACPP_LOGITS="$(abspath $(BUILD))/llamacpp-logits" go test -count=1 -v -run 'TestLlamaCpp' ./cmd/xpu/
	XPU_LLAMA_VOCAB_DIR="$(LLAMA_VOCAB_DIR)" XPU_LLAMA_TOKENIZE="$(wildcard $(LLAMA_BIN)/llama-tokenize)" go test -count=1 -v -run 'TestLlamaCppVocabFiles' ./llm/tokenizer/

# make test checks xpu quantize and the tokenizers against llama.cpp's outputs stored as golden
# files (cmd/xpu/testdata/llamacpp, llm/tokenizer/testdata/llamacpp_ids.json); this rewrites
# them from a llama.cpp build (LLAMA_BIN with llama-quantize and llama-tokenize); not in make test.
.PHONY: llamacpp-goldens
llamacpp-goldens:
	@test -n "$(LLAMA_BIN)" || { echo "make llamacpp-goldens: set LLAMA_BIN to a llama.cpp build's bin folder (llama-quantize, llama-tokenize)" >&2; exit 2; }
	bash scripts/llamacpp-goldens.sh "$(LLAMA_BIN)" $(LLAMA_CPP_COMMIT)

# Side by side with llama.cpp's llama-bench on the same GGUF files (docs/PERFORMANCE.md):
# LLAMA_BIN=<llama.cpp build/bin> is required, nothing is downloaded; VS_MODELS="a.gguf b.gguf"
# (default: the 1B Q4_0 and Q8_0 models, generated); ROUNDS, REPS, THREADS, PP, TG, DEPTH and
# XPU_FLAGS as in bench/vs-llamacpp.sh.
.PHONY: bench-vs-llamacpp
bench-vs-llamacpp:
	@test -n "$(LLAMA_BIN)" || { echo "make bench-vs-llamacpp: set LLAMA_BIN to a llama.cpp build's bin folder (the one holding llama-bench)" >&2; exit 2; }
	$(MAKE) all
	LLAMA_BIN="$(LLAMA_BIN)" XPU="$(BUILD)/xpu" bash bench/vs-llamacpp.sh $(VS_MODELS)

# docs/PERFORMANCE.md from the stored results (lab/results/*.jsonl, written by bench/lib.sh's
# record_result or `go run ./lab/perfgen record`); TestPerformanceMDIsGenerated fails when it is stale.
.PHONY: perf-table
perf-table:
	$(GO) run ./lab/perfgen
