# flashdecode: build, test, tune, bench, export, install.
# `make` builds everything; `make test` is the test command; `make tune` the main job.
CC      ?= gcc
LUA     ?= lua5.4
LUAJIT  ?= luajit
B       := build
CFLAGS  ?= -O2 -g
# fd_shape and fd_args grow by appended fields whose zero keeps the old
# behaviour (docs/DESIGN.md): positional initializers that stop early are meant.
WARN    := -std=c11 -Wall -Wextra -Werror -Wno-missing-field-initializers -D_GNU_SOURCE
VERSION := $(shell sed -n 's/^\#define FD_VERSION "\(.*\)"/\1/p' runtime/flashdecode.h)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))

# What depends on installed packages (the static Lua and libtcc archives, Lua's
# include flags, the tcc version) is resolved after scripts/deps.sh has run:
# make builds $(B)/config.mk first and restarts with it, so the very first
# `make` on a bare machine links the same library as every later one.
NO_CONFIG_GOALS := clean uninstall help
ifneq ($(filter-out $(NO_CONFIG_GOALS),$(or $(MAKECMDGOALS),all)),)
include $(B)/config.mk
endif
$(B)/config.mk: scripts/deps.sh scripts/config.sh
	@mkdir -p $(B)
	bash scripts/deps.sh
	bash scripts/config.sh > $@.tmp
	mv $@.tmp $@

INC     := -Iruntime -I$(B) $(LUA_CF)
LIBS    := $(TCC_STATIC) $(LUA_STATIC) -ldl -lpthread -lm

GEN_LUA   := $(wildcard gen/*.lua)
TEMPLATES := $(wildcard templates/*.tpl)
LIB_SRC   := $(wildcard runtime/*.c)
RT_OBJ    := $(LIB_SRC:runtime/%.c=$(B)/obj/%.o) $(B)/obj/embedded.o
# The library's objects with every internal symbol still global: tests and fdgen link this.
INTERNAL_A := $(B)/libfd_internal.a
GENERATED := $(B)/fd_abi.h $(B)/fd_keydefs.h $(B)/embedded.c

.PHONY: all deps lib test clean gen-default sanitize bench-plan help
.SECONDARY:
all: deps lib $(B)/fdgen $(B)/test_kernels $(B)/test_api $(B)/test_errors $(B)/test_merge $(B)/test_tables $(B)/test_concurrency $(B)/test_nonfinite $(B)/test_jit $(B)/test_determinism $(B)/test_paged $(B)/test_tokens $(B)/test_shared $(B)/test_schedule $(B)/test_window $(B)/test_kpc_beams $(B)/test_msd $(B)/test_fast $(B)/test_model

# libflashdecode, static and shared, self-contained: the objects, Debian's static
# libtcc and Lua 5.4 prelinked into one object whose only global symbols are the
# functions of flashdecode.h (everything compiled with hidden visibility; the
# exported list is read from the shared library itself). The .so carries a
# SONAME; a host embedding another Lua (LuaJIT) cannot capture its lua_* calls.
SO_REAL := libflashdecode.so.$(VERSION)
SO_NAME := libflashdecode.so.$(SOMAJOR)
lib: $(B)/libflashdecode.a $(B)/libflashdecode.so $(B)/$(SO_NAME)
$(INTERNAL_A): $(RT_OBJ)
	rm -f $@; ar rcs $@ $^
$(B)/$(SO_REAL): $(RT_OBJ) $(B)/obj/tcc_shim.o
	$(CC) -shared -Wl,-soname,$(SO_NAME) -Wl,--no-undefined -o $@ $^ -Wl,--exclude-libs,ALL $(LIBS)
$(B)/$(SO_NAME) $(B)/libflashdecode.so: $(B)/$(SO_REAL)
	ln -sf $(SO_REAL) $@
$(B)/public.syms: $(B)/$(SO_REAL)
	nm -D --defined-only $< | awk '$$2 == "T" { print $$3 }' | sort > $@
$(B)/libflashdecode.a: $(RT_OBJ) $(B)/public.syms
	$(CC) -r -nostdlib -o $(B)/obj/flashdecode_all.o $(RT_OBJ) -Wl,--whole-archive $(TCC_STATIC) $(LUA_STATIC) -Wl,--no-whole-archive
	objcopy --keep-global-symbols=$(B)/public.syms $(B)/obj/flashdecode_all.o
	rm -f $@; ar rcs $@ $(B)/obj/flashdecode_all.o
$(B)/obj/tcc_shim.o: runtime/shared/tcc_shim.c | $(B)/config.mk
	@mkdir -p $(B)/obj
	$(CC) $(WARN) $(CFLAGS) -fPIC -c $< -o $@

deps: $(B)/config.mk

# Build-time outputs of the generator (rewritten only when their content changes).
$(B)/fd_abi.h: templates/abi.h.tpl $(GEN_LUA) | $(B)/config.mk
	$(LUA) gen/build.lua abi $@
$(B)/fd_keydefs.h: gen/key.lua gen/facts.lua gen/build.lua | $(B)/config.mk
	$(LUA) gen/build.lua keydefs $@
	$(LUA) gen/build.lua python python/flashdecode/_facts.py
$(B)/embedded.c: $(GEN_LUA) $(TEMPLATES) | $(B)/config.mk
	$(LUA) gen/build.lua embed $@ $(GEN_LUA) $(TEMPLATES)

$(B)/obj/%.o: runtime/%.c $(GENERATED) $(wildcard runtime/*.h)
	@mkdir -p $(B)/obj
	$(CC) $(WARN) $(CFLAGS) -fPIC -fvisibility=hidden $(INC) -DFD_TCC_VERSION='"$(TCC_VER)"' -c $< -o $@
$(B)/obj/embedded.o: $(B)/embedded.c runtime/embedded.h
	@mkdir -p $(B)/obj
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden $(INC) -c $< -o $@

# The command line (tools/fdgen/): the library plus the double-precision reference and
# the random problems `fdgen run` checks with. The C tests use those two files as well.
CLI_LIB := tools/fdgen/ref.c tools/fdgen/problem.c
$(B)/fdgen: tools/fdgen/fdgen.c $(CLI_LIB) $(wildcard tools/fdgen/*.h) $(INTERNAL_A)
	$(CC) $(WARN) $(CFLAGS) $(INC) -Itools/fdgen tools/fdgen/fdgen.c $(CLI_LIB) $(INTERNAL_A) $(LIBS) -o $@

TEST_LIB := $(CLI_LIB) tests/kexec.c tests/compare.c tests/tcheck.c
TEST_INC := -Itests -Itools/fdgen
TEST_HDR := $(wildcard tests/*.h tools/fdgen/*.h)
$(B)/test_kernels: tests/test_kernels.c $(TEST_LIB) $(RT_OBJ) $(TEST_HDR)
	$(CC) $(WARN) $(CFLAGS) $(INC) $(TEST_INC) tests/test_kernels.c $(TEST_LIB) $(RT_OBJ) $(LIBS) -o $@

$(B)/test_%: tests/test_%.c $(TEST_LIB) $(INTERNAL_A) $(TEST_HDR)
	$(CC) $(WARN) $(CFLAGS) $(INC) $(TEST_INC) $< $(TEST_LIB) $(INTERNAL_A) $(LIBS) -o $@

# The library's objects compiled again, instrumented: $(eval $(call instrumented_lib,DIR,CC,WARN,FLAGS))
# builds $(B)/DIR/*.o with CC and FLAGS (WARN for the library's own sources, not
# the generated embedded.c) and lists them in DIR_OBJ. The ASan, TSan and fuzzing
# builds (tests/tsan.mk, tests/fuzz/fuzz.mk) all use it.
define instrumented_lib
$(1)_OBJ := $(LIB_SRC:runtime/%.c=$(B)/$(1)/%.o) $(B)/$(1)/embedded.o
$(B)/$(1)/%.o: runtime/%.c $(GENERATED) $(wildcard runtime/*.h)
	@mkdir -p $(B)/$(1)
	$(2) $(3) $(4) $(INC) -DFD_TCC_VERSION='"$(TCC_VER)"' -c $$< -o $$@
$(B)/$(1)/embedded.o: $(B)/embedded.c runtime/embedded.h
	@mkdir -p $(B)/$(1)
	$(2) $(4) $(INC) -c $$< -o $$@
endef

# The library and its C tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
$(eval $(call instrumented_lib,san,$(CC),$(WARN),-O1 -g $(SAN)))
SAN_OBJ  := $(san_OBJ)
SAN_TESTS := $(B)/san/test_api $(B)/san/test_errors $(B)/san/test_kernels $(B)/san/test_merge $(B)/san/test_tables $(B)/san/test_model $(B)/san/test_concurrency $(B)/san/test_nonfinite $(B)/san/test_determinism $(B)/san/test_paged $(B)/san/test_tokens $(B)/san/test_shared $(B)/san/test_schedule $(B)/san/test_window $(B)/san/test_kpc_beams $(B)/san/test_msd $(B)/san/test_fast
sanitize: $(SAN_TESTS)
$(B)/san/test_%: tests/test_%.c $(TEST_LIB) $(SAN_OBJ) $(TEST_HDR)
	$(CC) $(WARN) -O1 -g $(SAN) $(INC) $(TEST_INC) $< $(TEST_LIB) $(SAN_OBJ) $(LIBS) -o $@

# Every variant the default shape set needs, for the compile test.
gen-default: deps
	$(LUA) gen/fdgen.lua gen tuner/shapes/default.lua -o $(B)/gen/default

test: all gen-default sanitize tsan-build fuzz-build $(B)/check_vanilla $(B)/libfdbench.so $(B)/ab $(B)/builds
	bash tests/run.sh

# Planning, JIT and fd_run times over the default shape set (a benchmark, not a
# test): generated in the process, then again from sources kept by a first run
# in a fresh $$FD_CACHE_DIR (the -cached report).
bench-plan: all
	@mkdir -p results/runtime
	$(B)/fdgen bench tuner/shapes/default.lua -o results/runtime/plan-$$($(B)/fdgen machine).md
	@cat results/runtime/plan-$$($(B)/fdgen machine).md
	@rm -rf $(B)/plan-cache && mkdir -p $(B)/plan-cache
	FD_CACHE_DIR=$(B)/plan-cache $(B)/fdgen bench tuner/shapes/default.lua -o /dev/null
	FD_CACHE_DIR=$(B)/plan-cache $(B)/fdgen bench tuner/shapes/default.lua -o results/runtime/plan-$$($(B)/fdgen machine)-cached.md
	@sed -n '/JIT per key/,$$p' results/runtime/plan-$$($(B)/fdgen machine)-cached.md

# Install: `make install PREFIX=/usr/local DESTDIR=` and `make uninstall` (the same list).
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
LUADIR     ?= $(PREFIX)/share/lua/5.1
PY_VER      = $(shell /usr/bin/python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYDIR      ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/$(PY_VER)/dist-packages)
PY_FILES   := $(notdir $(wildcard python/flashdecode/*.py))
# Installed file (relative to DESTDIR) and its source, one pair per line; the
# library symlinks and flashdecode.pc are made by the recipe.
INSTALL_MAP = $(LIBDIR)/$(SO_REAL):$(B)/$(SO_REAL) $(LIBDIR)/libflashdecode.a:$(B)/libflashdecode.a \
	$(INCLUDEDIR)/flashdecode.h:runtime/flashdecode.h $(BINDIR)/fdgen:$(B)/fdgen \
	$(LUADIR)/flashdecode.lua:lua/flashdecode.lua \
	$(LUADIR)/flashdecode_facts.lua:gen/facts.lua \
	$(foreach f,$(PY_FILES),$(PYDIR)/flashdecode/$(f):python/flashdecode/$(f))
INSTALLED  = $(foreach p,$(INSTALL_MAP),$(firstword $(subst :, ,$(p)))) \
	$(LIBDIR)/$(SO_NAME) $(LIBDIR)/libflashdecode.so $(LIBDIR)/pkgconfig/flashdecode.pc
# Placeholders the installed copies of the modules and flashdecode.pc get filled with.
SUBST      = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g'

.PHONY: install uninstall
install: lib $(B)/fdgen
	@set -e; for p in $(INSTALL_MAP); do dst=$(DESTDIR)$${p%%:*}; src=$${p#*:}; \
	  mode=644; case $$dst in */bin/*|*.so.*) mode=755;; esac; \
	  echo "install $$src -> $$dst"; install -d "$$(dirname "$$dst")"; \
	  case $$src in *.lua|*.py) $(SUBST) "$$src" > "$$dst"; chmod $$mode "$$dst";; \
	    *) install -m $$mode "$$src" "$$dst";; esac; done
	ln -sf $(SO_REAL) $(DESTDIR)$(LIBDIR)/$(SO_NAME)
	ln -sf $(SO_NAME) $(DESTDIR)$(LIBDIR)/libflashdecode.so
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig
	$(SUBST) runtime/flashdecode.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/flashdecode.pc
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then ldconfig; fi

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(PYDIR)/flashdecode 2>/dev/null
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then ldconfig; fi

# The targets a user runs, one line each.
help:
	@echo "make                 build the library (build/libflashdecode.{so,a}), fdgen and the tests"
	@echo "make tune [QUICK=1]  the main job: tune the default shape set on this machine (README: The main job)"
	@echo "make test            build everything and run every test; ends with 'N passed, N failed'"
	@echo "make bench [QUICK=1] the benchmark report under results/bench/"
	@echo "make bench-plan      plan and JIT times per shape"
	@echo "make bench-peers [QUICK=1]  flashdecode vs ggml flash_attn_ext (pip + cmake once, ~4 min)"
	@echo "make bench-builds REV=<rev> [MODE=cold] [ROUNDS=n]  the kernels of git revision REV against this tree's, one plan"
	@echo "make bench-history  issue 18's bounds over every committed make bench run (git history)"
	@echo "make install [PREFIX=/usr/local] [DESTDIR=]   library, header, pkg-config file, fdgen, LuaJIT and Python modules"
	@echo "make uninstall [PREFIX=...] [DESTDIR=]       remove every installed file"
	@echo "make mpi | test-mpi | bench-mpi   libflashdecode_mpi, fdmpi-bench, MPI tests np 1-4 (needs mpicc)"
	@echo "make tsan | fuzz [FUZZ_S=60]      ThreadSanitizer build of the concurrency test; libFuzzer targets"
	@echo "make export | tune-verify | sanitize | clean"

clean:
	rm -rf $(B)

# The tuner (make tune, export) and the benchmark (make bench) keep their rules beside their code.
-include tuner/tune.mk
-include tests/tsan.mk
-include tests/fuzz/fuzz.mk
-include bench/bench.mk
-include bench/peers/peers.mk
-include mpi/mpi.mk
