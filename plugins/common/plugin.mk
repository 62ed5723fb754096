# plugins/common: what every plugin compiles in (header-only). Its own check: the timeline fence
# and worker queue of xpu_sync.h, under ASan + UBSan.
COMMON_SYNC_TEST := $(BUILD)/common/sync_test
PLUGIN_TESTS += test-common-sync

$(COMMON_SYNC_TEST): plugins/common/test/sync_test.c plugins/common/xpu_sync.h abi/xpu_backend.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -Iabi -Iplugins/common -o $@ $< -lpthread

.PHONY: test-common-sync
test-common-sync: $(COMMON_SYNC_TEST)
	ASAN_OPTIONS=detect_leaks=0 timeout 60 $(COMMON_SYNC_TEST)


