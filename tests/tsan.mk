# The library and the concurrency test under ThreadSanitizer (issue 13).
# Included from the Makefile (-include tests/tsan.mk), which defines B, CC,
# WARN, INC, LIBS, TEST_LIB, TEST_INC, TEST_HDR and instrumented_lib; `make tsan` builds and runs it,
# `make tsan-build` only builds it (for tests/run.sh).
#
# libtcc and Lua are linked uninstrumented: every libtcc call holds one mutex
# (runtime/jit.c) and the Lua generator runs under the kernel cache's mutex
# (runtime/kcache.c), so TSan sees those locks around them; the generated
# kernels are not instrumented either (their reads and writes are ordered by
# the pool's and the executor's atomics, which are). No suppressions.
TSAN       := -fsanitize=thread -fno-omit-frame-pointer
$(eval $(call instrumented_lib,tsan,$(CC),$(WARN),-O1 -g $(TSAN)))
TSAN_OBJ   := $(tsan_OBJ)
TSAN_TESTS := $(B)/tsan/test_concurrency
TSAN_ENV   := TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1"

.PHONY: tsan tsan-build
tsan-build: $(TSAN_TESTS)
tsan: tsan-build
	@set -e; for t in $(TSAN_TESTS); do echo "== $$t"; $(TSAN_ENV) $$t; done

$(B)/tsan/test_%: tests/test_%.c $(TEST_LIB) $(TSAN_OBJ) $(TEST_HDR)
	$(CC) $(WARN) -O1 -g $(TSAN) $(INC) $(TEST_INC) $< $(TEST_LIB) $(TSAN_OBJ) $(LIBS) -o $@
