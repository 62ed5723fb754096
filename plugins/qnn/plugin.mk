# QNN NPU plugin (plugins/qnn) and the clean-room QNN provider it is tested against (plugins/qnn/emu).
# The emulator is NOT named libxpu-*.so: it is a QNN backend library, not an xpu plugin. The plugin
# finds it beside itself (build/plugins/qnn/) when neither XPU_QNN_LIBRARY nor QNN_SDK_ROOT is set.
# The C lives in src/ because Go refuses .c files beside the package of the Go tests.
QNN_SRCS := $(wildcard plugins/qnn/src/*.c)
QNN_HDRS := $(wildcard plugins/qnn/src/*.h)
QNN_EMU_SRCS := $(wildcard plugins/qnn/emu/*.c)
QNN_EMU_HDRS := $(wildcard plugins/qnn/emu/*.h) plugins/qnn/src/qnn_api.h plugins/qnn/src/qnn_half.h
# changes whenever a source that can change results changes: part of the executable cache key
QNN_BUILD_ID := qnn-$(shell cat $(QNN_SRCS) $(QNN_HDRS) $(COMMON_HDRS) | sha1sum | cut -c1-16)
QNN_EMU := $(PLUGIN_DIR)/qnn/libQnnXpuEmu.so
QNN_TEST_BIN := $(BUILD)/qnn/qnn_ctest

# a memfd-backed stand-in for the phone's libcdsprpc.so (rpcmem), for the shared-buffer tests
QNN_FAKE_RPCMEM := $(BUILD)/qnn/libcdsprpc-fake.so

PLUGINS += $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) $(QNN_FAKE_RPCMEM)
PLUGIN_TESTS += test-qnn-c test-qnn-arm64

$(PLUGIN_DIR)/libxpu-qnn.so: $(QNN_SRCS) $(QNN_HDRS) $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -DXPU_QNN_BUILD_ID='"$(QNN_BUILD_ID)"' -o $@ $(QNN_SRCS) $(PLUGIN_LDFLAGS)

$(QNN_EMU): $(QNN_EMU_SRCS) $(QNN_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -o $@ $(QNN_EMU_SRCS) $(PLUGIN_LDFLAGS)

$(QNN_FAKE_RPCMEM): plugins/qnn/test/fake_cdsprpc.c
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -o $@ $< $(PLUGIN_LDFLAGS)

$(QNN_TEST_BIN): plugins/qnn/test/qnn_ctest.c $(QNN_HDRS) $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -Iabi -Iplugins/common -Iplugins/qnn/src -D_GNU_SOURCE -o $@ $< -ldl -lm -lpthread

.PHONY: test-qnn-c test-qnn test-qnn-arm64 conform-qnn-htp conform-qnn-cpu
# conformance on the emulator's HTP profile (the default: the HTP's op tables, FP16 graphs) and its
# CPU profile (libQnnCpu's tables, FLOAT_32 only); reports in build/conformance-qnn-{htp,cpu}
conform-qnn-htp: $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) cli
	XPU_QNN_EMU_PROFILE=htp $(BUILD)/xpu conform --plugin $(PLUGIN_DIR)/libxpu-qnn.so --report $(BUILD)/conformance-qnn-htp
conform-qnn-cpu: $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) cli
	XPU_QNN_EMU_PROFILE=cpu $(BUILD)/xpu conform --plugin $(PLUGIN_DIR)/libxpu-qnn.so --report $(BUILD)/conformance-qnn-cpu

# the emulator's rules, the plugin end to end on hand-built IR, and the context-binary cache,
# under valgrind when it is installed
# (twice: the CPU profile against f32 references, the HTP profile's rules)
test-qnn-c: $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) $(QNN_TEST_BIN)
	@for prof in cpu htp; do \
	  if command -v valgrind >/dev/null 2>&1; then \
	    XPU_QNN_EMU_PROFILE=$$prof valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	      $(QNN_TEST_BIN) $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) || exit 1; \
	  else XPU_QNN_EMU_PROFILE=$$prof $(QNN_TEST_BIN) $(PLUGIN_DIR)/libxpu-qnn.so $(QNN_EMU) || exit 1; fi; \
	done

# the phone's architecture: the layout asserts, the plugin, the emulator and the C test built
# for aarch64 and run under qemu
QNN_ARM64 := $(BUILD)/arm64/qnn
$(QNN_ARM64)/libxpu-qnn.so: $(QNN_SRCS) $(QNN_HDRS) $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(CC_ARM64) $(PLUGIN_CFLAGS) -DXPU_QNN_BUILD_ID='"$(QNN_BUILD_ID)"' -o $@ $(QNN_SRCS) $(PLUGIN_LDFLAGS)
$(QNN_ARM64)/libQnnXpuEmu.so: $(QNN_EMU_SRCS) $(QNN_EMU_HDRS)
	@mkdir -p $(dir $@)
	$(CC_ARM64) $(PLUGIN_CFLAGS) -o $@ $(QNN_EMU_SRCS) $(PLUGIN_LDFLAGS)
$(QNN_ARM64)/qnn_ctest: plugins/qnn/test/qnn_ctest.c $(QNN_HDRS) $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC_ARM64) -std=c11 -O1 -g -Wall -Wextra -Werror -Iabi -Iplugins/common -Iplugins/qnn/src -D_GNU_SOURCE -o $@ $< -ldl -lm -lpthread
test-qnn-arm64: $(QNN_ARM64)/libxpu-qnn.so $(QNN_ARM64)/libQnnXpuEmu.so $(QNN_ARM64)/qnn_ctest
	XPU_QNN_EMU_PROFILE=cpu qemu-aarch64 -L /usr/aarch64-linux-gnu $(QNN_ARM64)/qnn_ctest $(QNN_ARM64)/libxpu-qnn.so $(QNN_ARM64)/libQnnXpuEmu.so
	XPU_QNN_EMU_PROFILE=htp qemu-aarch64 -L /usr/aarch64-linux-gnu $(QNN_ARM64)/qnn_ctest $(QNN_ARM64)/libxpu-qnn.so $(QNN_ARM64)/libQnnXpuEmu.so

# against a real SDK: QNN_SDK_ROOT=/opt/qairt/2.25 make test-qnn (libQnnHtp.so first, then
# libQnnCpu.so; XPU_QNN_LIBRARY picks one explicitly)
test-qnn: $(PLUGIN_DIR)/libxpu-qnn.so cli
	@test -n "$$QNN_SDK_ROOT$$XPU_QNN_LIBRARY" || { echo "test-qnn: set QNN_SDK_ROOT or XPU_QNN_LIBRARY"; exit 1; }
	@mkdir -p $(BUILD)/conformance-qnn
	$(BUILD)/xpu conform --plugin $(PLUGIN_DIR)/libxpu-qnn.so --report $(BUILD)/conformance-qnn
