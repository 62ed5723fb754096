# OpenCL GPU plugin. libOpenCL is dlopen'ed at run time, never linked: the Khronos headers
# (opencl-headers) give types and constants only. kernels.cl is embedded as a C string. The C
# lives in src/ because Go refuses .c files beside the package of the Go tests.
OPENCL_SRCS := $(wildcard plugins/opencl/src/*.c)
OPENCL_HDRS := $(wildcard plugins/opencl/src/*.h)
OPENCL_GEN  := $(BUILD)/gen/opencl/ocl_kernels_cl.h
OPENCL_SO   := $(PLUGIN_DIR)/libxpu-opencl.so

PLUGINS += $(OPENCL_SO)
PLUGIN_TESTS += test-opencl-smoke test-opencl-asan

$(OPENCL_GEN): plugins/opencl/src/kernels.cl plugins/opencl/plugin.mk
	@mkdir -p $(dir $@)
	@{ echo '/* generated from plugins/opencl/kernels.cl by plugin.mk: do not edit */'; \
	  echo 'static const char ocl_kernels_src[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; \
	  echo ';'; } > $@.tmp && mv $@.tmp $@

$(OPENCL_SO): $(OPENCL_SRCS) $(OPENCL_HDRS) $(OPENCL_GEN) $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -I$(dir $(OPENCL_GEN)) -o $@ $(OPENCL_SRCS) $(PLUGIN_LDFLAGS)

$(BUILD)/opencl-smoke: plugins/opencl/test/smoke.c $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $< -ldl -lm

.PHONY: test-opencl-smoke
test-opencl-smoke: $(OPENCL_SO) $(BUILD)/opencl-smoke
	timeout 600 $(BUILD)/opencl-smoke $(OPENCL_SO)
	XPU_OPENCL_LIBRARY=/nonexistent timeout 60 $(BUILD)/opencl-smoke --probe-only-zero $(OPENCL_SO)

# The same smoke test with the plugin and the test built under ASan + UBSan: the C paths
# (IR checks, offsets, fences, cache reader) run with every access checked. Leak checking stays
# off: PoCL and LLVM keep allocations to exit, and LSan needs ptrace, which CI sandboxes may deny.
OPENCL_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
$(BUILD)/opencl-asan/libxpu-opencl.so: $(OPENCL_SRCS) $(OPENCL_HDRS) $(OPENCL_GEN) $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -O1 $(OPENCL_SAN) -I$(dir $(OPENCL_GEN)) -o $@ $(OPENCL_SRCS) $(PLUGIN_LDFLAGS)

$(BUILD)/opencl-asan/smoke: plugins/opencl/test/smoke.c $(COMMON_HDRS) abi/xpu_ir_build.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror $(OPENCL_SAN) -Iabi -Iplugins/common -D_GNU_SOURCE -o $@ $< -ldl -lm

.PHONY: test-opencl-asan
test-opencl-asan: $(BUILD)/opencl-asan/libxpu-opencl.so $(BUILD)/opencl-asan/smoke
	ASAN_OPTIONS=detect_leaks=0 timeout 900 $(BUILD)/opencl-asan/smoke $(BUILD)/opencl-asan/libxpu-opencl.so
