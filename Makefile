# flashdecode: build, test, tune, bench, export, install.
# `make` builds everything; `make test` is the test command; `make tune` the main job.
CC      ?= gcc
LUA     ?= lua5.4
LUAJIT  ?= luajit
B       := build
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE
LUA_CF  := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUA_LIB := $(shell pkg-config --libs lua5.4 2>/dev/null || echo -llua5.4)
TCC_VER := $(shell tcc -v 2>/dev/null | sed -n 's/^tcc version \([^ ]*\).*/\1/p')
INC     := -Iruntime -I$(B) $(LUA_CF)
LIBS    := -ltcc $(LUA_LIB) -ldl -lpthread -lm
LUA_STATIC := $(firstword $(wildcard /usr/lib/$(shell gcc -dumpmachine)/liblua5.4.a /usr/lib/liblua5.4.a) -llua5.4)

GEN_LUA   := $(wildcard gen/*.lua)
TEMPLATES := $(wildcard templates/*.tpl)
RT_SRC    := $(wildcard runtime/*.c)
LIB_SRC   := $(filter-out runtime/fdgen.c,$(RT_SRC))
RT_OBJ    := $(LIB_SRC:runtime/%.c=$(B)/obj/%.o) $(B)/obj/embedded.o
GENERATED := $(B)/fd_abi.h $(B)/fd_keydefs.h $(B)/embedded.c

.PHONY: all deps lib test clean gen-default sanitize bench-plan
.SECONDARY:
all: deps lib $(B)/fdgen $(B)/test_kernels $(B)/test_api $(B)/test_errors

# libflashdecode, static and shared (Lua 5.4 and libtcc linked in; generator embedded).
lib: $(B)/libflashdecode.a $(B)/libflashdecode.so
$(B)/libflashdecode.a: $(RT_OBJ)
	ar rcs $@ $^
$(B)/libflashdecode.so: $(RT_OBJ) $(B)/obj/tcc_shim.o
	$(CC) -shared -o $@ $^ -Wl,--exclude-libs,libtcc.a:liblua5.4.a -ltcc $(LUA_STATIC) -ldl -lpthread -lm
$(B)/obj/tcc_shim.o: runtime/shared/tcc_shim.c
	@mkdir -p $(B)/obj
	$(CC) $(WARN) $(CFLAGS) -fPIC -c $< -o $@

deps: $(B)/.deps
$(B)/.deps: scripts/deps.sh
	@mkdir -p $(B)
	bash scripts/deps.sh
	@touch $@

# Build-time outputs of the generator (rewritten only when their content changes).
$(B)/fd_abi.h: templates/abi.h.tpl $(GEN_LUA) | $(B)/.deps
	$(LUA) gen/build.lua abi $@
$(B)/fd_keydefs.h: gen/key.lua gen/build.lua | $(B)/.deps
	$(LUA) gen/build.lua keydefs $@
$(B)/embedded.c: $(GEN_LUA) $(TEMPLATES) | $(B)/.deps
	$(LUA) gen/build.lua embed $@ $(GEN_LUA) $(TEMPLATES)

$(B)/obj/%.o: runtime/%.c $(GENERATED) $(wildcard runtime/*.h)
	@mkdir -p $(B)/obj
	$(CC) $(WARN) $(CFLAGS) -fPIC $(INC) -DFD_TCC_VERSION='"$(TCC_VER)"' -c $< -o $@
$(B)/obj/embedded.o: $(B)/embedded.c runtime/embedded.h
	@mkdir -p $(B)/obj
	$(CC) $(CFLAGS) -fPIC $(INC) -c $< -o $@

# The command line: the library plus the test problem generator and reference (for `fdgen run`).
$(B)/fdgen: runtime/fdgen.c tests/kexec.c tests/ref.c tests/compare.c tests/tcheck.c $(B)/libflashdecode.a
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itests $^ $(LIBS) -o $@

TEST_LIB := tests/kexec.c tests/ref.c tests/compare.c tests/tcheck.c
$(B)/test_kernels: tests/test_kernels.c $(TEST_LIB) $(RT_OBJ) $(wildcard tests/*.h)
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itests tests/test_kernels.c $(TEST_LIB) $(RT_OBJ) $(LIBS) -o $@

$(B)/test_%: tests/test_%.c $(TEST_LIB) $(B)/libflashdecode.a $(wildcard tests/*.h)
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itests $< $(TEST_LIB) $(B)/libflashdecode.a $(LIBS) -o $@

# The library and its C tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_OBJ  := $(LIB_SRC:runtime/%.c=$(B)/san/%.o) $(B)/san/embedded.o
SAN_TESTS := $(B)/san/test_api $(B)/san/test_errors $(B)/san/test_kernels
sanitize: $(SAN_TESTS)
$(B)/san/%.o: runtime/%.c $(GENERATED) $(wildcard runtime/*.h)
	@mkdir -p $(B)/san
	$(CC) $(WARN) -O1 -g $(SAN) $(INC) -DFD_TCC_VERSION='"$(TCC_VER)"' -c $< -o $@
$(B)/san/embedded.o: $(B)/embedded.c runtime/embedded.h
	@mkdir -p $(B)/san
	$(CC) -O1 -g $(SAN) $(INC) -c $< -o $@
$(B)/san/test_%: tests/test_%.c $(TEST_LIB) $(SAN_OBJ) $(wildcard tests/*.h)
	$(CC) $(WARN) -O1 -g $(SAN) $(INC) -Itests $< $(TEST_LIB) $(SAN_OBJ) $(LIBS) -o $@

# Every variant the default shape set needs, for the compile test.
gen-default: deps
	$(LUA) gen/fdgen.lua gen tuner/shapes/default.lua -o $(B)/gen/default

test: all gen-default sanitize $(B)/check_vanilla
	bash tests/run.sh

# Planning, JIT and fd_run times over the default shape set (a benchmark, not a test).
bench-plan: all
	@mkdir -p results/runtime
	$(B)/fdgen bench tuner/shapes/default.lua -o results/runtime/plan-$$($(B)/fdgen machine).md
	@cat results/runtime/plan-$$($(B)/fdgen machine).md

clean:
	rm -rf $(B)

# The tuner (make tune, export) and the benchmark (make bench) keep their rules beside their code.
-include tuner/tune.mk
-include bench/bench.mk
