# libFuzzer targets (tests/fuzz/fuzz_*.c): the tuned-table loader, the tiling
# key's C decoder and encoder, fd_kernel_source. The library is compiled again
# with clang, ASan + UBSan and fuzzer coverage into $(B)/fuzzobj.
#   make fuzz FUZZ_S=60   each target for FUZZ_S seconds: executions, crashes, hangs
#   make fuzz-short       a few seconds each (`make test` runs this through tests/run.sh)
# Needs clang and its runtimes (Debian: clang, libclang-rt-14-dev).
FUZZ_CC      ?= clang
FUZZ_S       ?= 60
FUZZ_SHORT_S ?= 4
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_LIBS    ?= $(LIBS)
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,$(B)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
# The library's warnings as gcc checks them (-Werror there); clang's own extra ones are not fatal here.
FUZZ_LIB_WARN := $(filter-out -Werror,$(WARN))
$(eval $(call instrumented_lib,fuzzobj,$(FUZZ_CC),$(FUZZ_LIB_WARN),-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link))
FUZZ_OBJ     := $(fuzzobj_OBJ)

.PHONY: fuzz fuzz-short fuzz-build
fuzz-build: $(FUZZ_TARGETS)
fuzz: fuzz-build
	bash tests/fuzz/run.sh $(B)/fuzz $(FUZZ_S)
fuzz-short: fuzz-build
	bash tests/fuzz/run.sh $(B)/fuzz $(FUZZ_SHORT_S)

$(B)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FUZZ_OBJ)
	@mkdir -p $(B)/fuzz
	$(FUZZ_CC) $(WARN) -O1 -g $(FUZZ_SAN) -fsanitize=fuzzer $(INC) $< $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@
