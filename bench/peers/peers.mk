# `make bench-peers`: flashdecode against ggml's ggml_flash_attn_ext (llama.cpp),
# included by the main Makefile. Uses B, CC and LUAJIT.
#   make bench-peers           every shape of bench/peers/shapes.lua, all cores and 1 thread
#                              (about 5 minutes on 2 cores, plus ~3 minutes once for pip + the ggml build)
#   make bench-peers QUICK=1   the quick lengths, all cores only
# ggml comes from the llama-cpp-python sdist on PyPI (pinned below), built once into
# $(B)/peers/ggml-<version>; without pip or network the report says "peer unavailable".
FDP_LLAMA_CPP_PYTHON ?= 0.3.36
FDP_DIR    := $(B)/peers
FDP_CFLAGS := -std=c11 -O2 -march=native -fopenmp -Wall -Wextra -Werror -D_GNU_SOURCE -Iruntime -Ibench -Itools/fdgen
FDP_SRC    := bench/peers/peers.c bench/bw.c bench/util.c tools/fdgen/ref.c
FDP_HDR    := bench/bw.h bench/util.h bench/dtype.h tools/fdgen/ref.h runtime/flashdecode.h

.PHONY: bench-peers fdp-ggml
# Always asked: the script returns at once when ggml is built, and rewrites
# ggml.flags only when they change (so the harness is relinked only then).
fdp-ggml:
	@mkdir -p $(FDP_DIR)
	@bash bench/peers/build_ggml.sh $(FDP_DIR) $(FDP_LLAMA_CPP_PYTHON)
$(FDP_DIR)/ggml.flags: fdp-ggml ;

# The harness links the shared libflashdecode and, when ggml.flags is not empty, ggml
# (fdp_link's argument: the peer's flags).
fdp_link = $(CC) $(FDP_CFLAGS) $(FDP_SRC) -o $@ $(1) -L$(B) -lflashdecode -Wl,-rpath,$(abspath $(B)) -lm
$(FDP_DIR)/fdpeers: $(FDP_SRC) $(FDP_HDR) $(FDP_DIR)/ggml.flags $(B)/libflashdecode.so bench/peers/peers.mk
	$(call fdp_link,$$(cat $(FDP_DIR)/ggml.flags))

# The harness without the peer (tests/test_peers.sh): no pip, no ggml build.
$(FDP_DIR)/fdpeers-noggml: $(FDP_SRC) $(FDP_HDR) $(B)/libflashdecode.so bench/peers/peers.mk
	@mkdir -p $(FDP_DIR)
	$(call fdp_link,)

bench-peers: lib $(FDP_DIR)/fdpeers
	OMP_WAIT_POLICY=passive FDP_HARNESS=$(FDP_DIR)/fdpeers FDP_PLOT_DIR=$(FDP_DIR)/plot $(LUAJIT) bench/peers/peers.lua
