# The library and the concurrency test under ThreadSanitizer (issue 13).
# Included from the Makefile (-include tests/tsan.mk), which defines B, CC,
# WARN, INC, LIBS, LIB_SRC, GENERATED, TEST_INC and TEST_HDR; `make tsan` builds and runs it,
# `make tsan-build` only builds it (for tests/run.sh).
#
# libtcc and Lua are linked uninstrumented: every libtcc call holds one mutex
# (runtime/jit.c) and the Lua generator runs under the kernel cache's mutex
# (runtime/kcache.c), so TSan sees those locks around them; the generated
# kernels are not instrumented either (their reads and writes are ordered by
# the pool's and the executor's atomics, which are). No suppressions.
TSAN       := -fsanitize=thread -fno-omit-frame-pointer
TSAN_OBJ   := $(LIB_SRC:runtime/%.c=$(B)/tsan/%.o) $(B)/tsan/embedded.o
TSAN_TESTS := $(B)/tsan/test_concurrency
TSAN_ENV   := TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1"

.PHONY: tsan tsan-build
tsan-build: $(TSAN_TESTS)
tsan: tsan-build
	@set -e; for t in $(TSAN_TESTS); do echo "== $$t"; $(TSAN_ENV) $$t; done

$(B)/tsan/%.o: runtime/%.c $(GENERATED) $(wildcard runtime/*.h)
	@mkdir -p $(B)/tsan
	$(CC) $(WARN) -O1 -g $(TSAN) $(INC) -DFD_TCC_VERSION='"$(TCC_VER)"' -c $< -o $@
$(B)/tsan/embedded.o: $(B)/embedded.c runtime/embedded.h
	@mkdir -p $(B)/tsan
	$(CC) -O1 -g $(TSAN) $(INC) -c $< -o $@
$(B)/tsan/test_%: tests/test_%.c tools/fdgen/ref.c tests/tcheck.c $(TSAN_OBJ) $(TEST_HDR)
	$(CC) $(WARN) -O1 -g $(TSAN) $(INC) $(TEST_INC) $< tools/fdgen/ref.c tests/tcheck.c $(TSAN_OBJ) $(LIBS) -o $@
