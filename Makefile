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

GEN_LUA   := $(wildcard gen/*.lua)
TEMPLATES := $(wildcard templates/*.tpl)
RT_SRC    := runtime/jit.c runtime/key.c runtime/luagen.c
RT_OBJ    := $(RT_SRC:runtime/%.c=$(B)/obj/%.o) $(B)/obj/embedded.o
GENERATED := $(B)/fd_abi.h $(B)/fd_keydefs.h $(B)/embedded.c

.PHONY: all deps test clean gen-default
all: deps $(B)/test_kernels

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

$(B)/test_kernels: tests/test_kernels.c tests/kexec.c tests/ref.c $(RT_OBJ) $(wildcard tests/*.h)
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itests tests/test_kernels.c tests/kexec.c tests/ref.c $(RT_OBJ) $(LIBS) -o $@

# Every variant the default shape set needs, for the compile test.
gen-default: deps
	$(LUA) gen/fdgen.lua gen tuner/shapes/default.lua -o $(B)/gen/default

test: all gen-default
	bash tests/run.sh

clean:
	rm -rf $(B)
