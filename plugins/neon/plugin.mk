# NEON CPU plugin. One NEON source: native on aarch64, through SIMDe on x86-64. The shipped
# C sources live in csrc/ so that the Go tests of this folder build without cgo.
# x86-64 build is portable (SSE2 baseline); libxpu-neon-avx2.so (AVX2/FMA/F16C) and
# libxpu-neon-avx512.so are the same source built for more, each probing higher where the CPU
# has what it needs (0 with the reason elsewhere), so the loader picks the best build that runs.
# The arm64 build picks vdotq_s32 at run time.
# probe.c is compiled apart, for the baseline ISA (see its header comment)
NEON_PROBE := plugins/neon/csrc/probe.c
NEON_SRCS := $(filter-out $(NEON_PROBE),$(wildcard plugins/neon/csrc/*.c))
NEON_HDRS := $(wildcard plugins/neon/csrc/*.h)
NEON_SO   := $(PLUGIN_DIR)/libxpu-neon.so
NEON_AVX2 := $(PLUGIN_DIR)/libxpu-neon-avx2.so
NEON_AVX512 := $(PLUGIN_DIR)/libxpu-neon-avx512.so
NEON_ARM64 := $(BUILD)/arm64/plugins/libxpu-neon.so
NEON_CFLAGS := $(filter-out -O2,$(PLUGIN_CFLAGS)) -O3

PLUGINS += $(NEON_SO) $(NEON_AVX2) $(NEON_AVX512)
PLUGIN_TESTS += test-neon-smoke test-neon-conform

$(NEON_SO): $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@)
	$(CC) $(NEON_CFLAGS) -DNV_VARIANT='"portable"' -o $@ $(NEON_SRCS) $(NEON_PROBE) $(PLUGIN_LDFLAGS)

$(NEON_AVX2): $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@) $(BUILD)/obj
	$(CC) $(NEON_CFLAGS) -DNV_VARIANT='"avx2"' -DNV_REQUIRE=1 -c -o $(BUILD)/obj/$(notdir $@).probe.o $(NEON_PROBE)
	$(CC) $(NEON_CFLAGS) -mavx2 -mfma -mf16c -DNV_VARIANT='"avx2"' -o $@ $(NEON_SRCS) $(BUILD)/obj/$(notdir $@).probe.o $(PLUGIN_LDFLAGS)

# AVX-512 adds a 12x32 GEMM micro-kernel; probes 0 on CPUs without AVX-512 F/BW/VL.
$(NEON_AVX512): $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@) $(BUILD)/obj
	$(CC) $(NEON_CFLAGS) -DNV_VARIANT='"avx512"' -DNV_REQUIRE=2 -c -o $(BUILD)/obj/$(notdir $@).probe.o $(NEON_PROBE)
	$(CC) $(NEON_CFLAGS) -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -DNV_VARIANT='"avx512"' -o $@ $(NEON_SRCS) $(BUILD)/obj/$(notdir $@).probe.o $(PLUGIN_LDFLAGS)

$(NEON_ARM64): $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@)
	$(CC_ARM64) $(NEON_CFLAGS) -DNV_VARIANT='"arm64"' -o $@ $(NEON_SRCS) $(NEON_PROBE) $(PLUGIN_LDFLAGS)

$(BUILD)/neon-smoke: plugins/neon/test/smoke.c $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $< -ldl -lm -lpthread

# The C smoke test: under valgrind for the portable build (leaks and out-of-bounds accesses fail
# it), natively for the others; then on emulated older CPUs (qemu-x86_64): the AVX2 build on a
# Haswell (its AVX2 int8 path, where this machine would pick VNNI), and every build on a Nehalem,
# where the AVX builds must probe 0 with a reason instead of dying of SIGILL.
QEMU_X86 := qemu-x86_64
.PHONY: test-neon-smoke
test-neon-smoke: $(NEON_SO) $(NEON_AVX2) $(NEON_AVX512) $(BUILD)/neon-smoke
	valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite $(BUILD)/neon-smoke $(NEON_SO)
	$(BUILD)/neon-smoke $(NEON_AVX2)
	$(BUILD)/neon-smoke $(NEON_AVX512)
	$(QEMU_X86) -cpu Haswell $(BUILD)/neon-smoke $(NEON_AVX2) 2> >(grep -v "TCG doesn't support" >&2)
	@for so in $(NEON_AVX2) $(NEON_AVX512); do \
	  $(QEMU_X86) -cpu Nehalem $(BUILD)/neon-smoke $$so 2> >(grep -v "TCG doesn't support" >&2) | tee /dev/stderr | grep -q "probes 0 here" \
	    || { echo "$$so did not probe 0 on a CPU without AVX2"; exit 1; }; \
	done

# The C smoke test (every kernel family, SPARSE_FFN's threads and bad indices included) with
# the plugin and the test built under ASan + UBSan, for the portable and the AVX2 build (the
# smoke test skips a build this CPU cannot run), then the whole conformance suite on the
# sanitized builds through the CLI with the sanitizer runtimes preloaded (Go is not built with
# ASan; handle_segv=0 leaves the Go runtime its signals). Not part of `make test`: valgrind
# already runs the portable build there; this adds the checks valgrind lacks (UB, stack and
# global overflows) and the AVX2 code paths. About 30 s once built (the build takes minutes).
NEON_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
$(BUILD)/neon-asan/libxpu-neon.so: $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -O3,$(NEON_CFLAGS)) -O1 $(NEON_SAN) -DNV_VARIANT='"portable"' -o $@ $(NEON_SRCS) $(NEON_PROBE) $(PLUGIN_LDFLAGS)

$(BUILD)/neon-asan/libxpu-neon-avx2.so: $(NEON_SRCS) $(NEON_PROBE) $(NEON_HDRS) $(COMMON_HDRS) plugins/neon/plugin.mk
	@mkdir -p $(dir $@) $(BUILD)/obj
	$(CC) $(filter-out -O3,$(NEON_CFLAGS)) -O1 $(NEON_SAN) -DNV_VARIANT='"avx2"' -DNV_REQUIRE=1 -c -o $(BUILD)/obj/asan-avx2.probe.o $(NEON_PROBE)
	$(CC) $(filter-out -O3,$(NEON_CFLAGS)) -O1 $(NEON_SAN) -mavx2 -mfma -mf16c -DNV_VARIANT='"avx2"' -o $@ $(NEON_SRCS) $(BUILD)/obj/asan-avx2.probe.o $(PLUGIN_LDFLAGS)

$(BUILD)/neon-asan/smoke: plugins/neon/test/smoke.c $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror $(NEON_SAN) -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $< -ldl -lm -lpthread

.PHONY: test-neon-asan
test-neon-asan: $(BUILD)/neon-asan/libxpu-neon.so $(BUILD)/neon-asan/libxpu-neon-avx2.so $(BUILD)/neon-asan/smoke cli
	@for so in $(BUILD)/neon-asan/libxpu-neon.so $(BUILD)/neon-asan/libxpu-neon-avx2.so; do \
	  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 timeout 300 $(BUILD)/neon-asan/smoke $$so || exit 1; \
	  if $(BUILD)/neon-asan/smoke $$so 2>/dev/null | grep -q "probes 0 here"; then continue; fi; \
	  echo "xpu conform --plugin $$so (ASan + UBSan)"; \
	  LD_PRELOAD=$$($(CC) -print-file-name=libasan.so):$$($(CC) -print-file-name=libubsan.so) \
	    ASAN_OPTIONS=detect_leaks=0:handle_segv=0:allow_user_segv_handler=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    timeout 600 $(BUILD)/xpu conform --plugin $$so --report "" | tail -n 1; \
	  test "$${PIPESTATUS[0]}" -eq 0 || exit 1; \
	done

# The conformance suite on each x86-64 build (about 3 s each, without -race): `go test -race`
# runs it on the first build only and `xpu conform --all` on the best one, so without this the
# portable (SSE2) build, the one that runs anywhere, would never be checked. The AVX-512 build
# runs where this CPU has AVX-512 (the smoke test says "probes 0 here" elsewhere).
.PHONY: test-neon-conform
test-neon-conform: $(NEON_SO) $(NEON_AVX2) $(NEON_AVX512) $(BUILD)/neon-smoke cli
	@set -e; for so in $(NEON_SO) $(NEON_AVX2) $(NEON_AVX512); do \
	  if $(BUILD)/neon-smoke $$so | grep -q "probes 0 here"; then echo "$$so probes 0 on this CPU: not tested"; continue; fi; \
	  echo "xpu conform --plugin $$so"; \
	  $(BUILD)/xpu conform --plugin $$so --report "" | tail -n 1; \
	  test "$${PIPESTATUS[0]}" -eq 0 || { echo "$$so fails conformance: rerun $(BUILD)/xpu conform --plugin $$so"; exit 1; }; \
	done

# arm64: the plugin and the Go tests of core and plugins/neon, cross-built and run under qemu.
# The plugin is exercised twice: on qemu's default CPU (with dotprod) and on a Cortex-A53
# model (without it), so that both int8 dot-product paths run. Discovery probes each plugin in a
# child process started from the test binary, which this kernel cannot exec without binfmt: a
# wrapper named by XPU_PLUGIN_HOST starts that child under qemu too.
ARM64_TESTS := $(BUILD)/arm64/tests
QEMU_ARM64 := qemu-aarch64 -L /usr/aarch64-linux-gnu

test-arm64: $(NEON_ARM64) $(BUILD)/arm64/neon-smoke
	@rm -rf $(ARM64_TESTS) && mkdir -p $(ARM64_TESTS)
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o $(ARM64_TESTS)/ ./core/...
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o $(ARM64_TESTS)/neon.test ./plugins/neon/
	$(QEMU_ARM64) $(BUILD)/arm64/neon-smoke $(NEON_ARM64)
	QEMU_CPU=cortex-a53 $(QEMU_ARM64) $(BUILD)/arm64/neon-smoke $(NEON_ARM64)
	@set -e; root=$$(pwd); for t in $(ARM64_TESTS)/*.test; do \
	  pkg=$$(basename $$t .test); \
	  case $$pkg in neon) dir=plugins/neon;; core) dir=core;; *) dir=core/$$pkg;; esac; \
	  echo "qemu-aarch64 $$t (in $$dir)"; \
	  host=$$root/$$t.host; printf '#!/bin/sh\nexec $(QEMU_ARM64) %s "$$@"\n' "$$root/$$t" > $$host; chmod +x $$host; \
	  (cd $$dir && XPU_PLUGIN_HOST=$$host XPU_PLUGIN_PATH=$$root/$(dir $(NEON_ARM64)) $(QEMU_ARM64) $$root/$$t -test.short -test.count=1); \
	done

$(BUILD)/arm64/neon-smoke: plugins/neon/test/smoke.c $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC_ARM64) -std=c11 -O1 -g -Wall -Wextra -Werror -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $< -ldl -lm -lpthread

# CPU kernel benchmarks (not part of `make test`): the NEON builds, the OpenBLAS harness
# (libopenblas-dev, installed here on demand; only the benchmark links it) and
# `go test -bench` in kernelbench/. BENCH_FILTER narrows it, e.g. BENCH_FILTER=GEMV.
BENCH_HARNESS := $(BUILD)/bench/libxpubench.so
BENCH_FILTER ?= .

$(BENCH_HARNESS): kernelbench/harness/harness.c
	@mkdir -p $(dir $@)
	@test -e /usr/include/x86_64-linux-gnu/cblas.h -o -e /usr/include/cblas.h || sudo -n apt-get install -y libopenblas-dev || apt-get install -y libopenblas-dev
	$(CC) -std=c11 -O3 -march=native -fPIC -shared -Wall -Wextra -Werror -o $@ $< -lopenblas -lpthread

.PHONY: bench-neon
bench-neon: $(NEON_SO) $(NEON_AVX2) $(NEON_AVX512) $(BENCH_HARNESS)
	$(GO) test -run '^$$' -bench '$(BENCH_FILTER)' -benchtime 3x -timeout 60m ./kernelbench/
