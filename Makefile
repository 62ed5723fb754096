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
COMMON_HDRS := abi/xpu_backend.h abi/xpu_ir.h plugins/common/xpu_plugin.h

PLUGINS :=
PLUGIN_TESTS :=
include $(sort $(wildcard plugins/*/plugin.mk))

.PHONY: all plugins cli deps demo test test-go test-conform test-arm64 vet clean
all: plugins cli

plugins: $(PLUGINS)

cli:
	$(GO) build -o $(BUILD)/xpu ./cmd/xpu

deps:
	@bash scripts/deps.sh

demo: deps all
	$(BUILD)/xpu demo

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...

test-go: all
	$(GO) test -race -count=1 ./...

test-conform: all
	@mkdir -p $(BUILD)/conformance
	$(BUILD)/xpu conform --all --report $(BUILD)/conformance

test: deps vet all $(PLUGIN_TESTS) test-go test-conform test-arm64
	@echo "make test: all checks passed"

clean:
	rm -rf $(BUILD)

# Side by side with llama.cpp's llama-bench on the same GGUF files (issue 13; BENCHMARKS.md):
# LLAMA_BIN=<llama.cpp build/bin> is required, nothing is downloaded; VS_MODELS="a.gguf b.gguf"
# (default: the 1B Q4_0 and Q8_0 models, generated); ROUNDS, REPS, THREADS, PP, TG, DEPTH and
# XPU_FLAGS as in bench/vs-llamacpp.sh.
.PHONY: bench-vs-llamacpp
bench-vs-llamacpp:
	@test -n "$(LLAMA_BIN)" || { echo "make bench-vs-llamacpp: set LLAMA_BIN to a llama.cpp build's bin folder (the one holding llama-bench)" >&2; exit 2; }
	$(MAKE) all
	LLAMA_BIN="$(LLAMA_BIN)" XPU="$(BUILD)/xpu" bash bench/vs-llamacpp.sh $(VS_MODELS)
