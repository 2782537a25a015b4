# The benchmark (`make bench`), included by the main Makefile. Uses B and CC.
# `make bench`: every shape of tuner/shapes/bench.lua (about 6.5 min on 2 cores: 342 s in the last report, then the paged, uneven, features and stream runs);
# `QUICK=1 make bench`: a short run (about 40 s) writing results/bench/<machine>-quick.md;
# `make bench-check`: the vanilla baseline against a double-precision loop.
# `make bench-paged`: paged KV against dense with the same plan (bench/paged.lua, about 30 s);
# `QUICK=1 make bench-paged`: the 16k row only, writing results/bench/paged-<machine>-quick.md.
# `make bench-uneven`: uneven batches (one 64k + seven 1k rows, and the mirror) against the
# uniform batch with the same total keys, one plan per shape (bench/uneven.lua, about 35 s);
# `QUICK=1 make bench-uneven`: fewer rounds (about 5 s), writing results/bench/uneven-<machine>-quick.md.
# `make bench-features`: window, sinks, ALiBi, softcap and sink logits against plain decode on
# Llama-3.1-8B at 64k, each variant its own plan (bench/features.lua, about 10 s);
# `QUICK=1 make bench-features`: fewer rounds (about 3 s), writing results/bench/features-<machine>-quick.md.
# `make bench-stream`: issue 18's bound rows beside a loop that only reads the same K and V and does
# their multiply-adds (f32 FMAs, or int8 dots for int8 KV; bench/stream.lua, about 70 s);
# `QUICK=1 make bench-stream`: the 16k/4k/2k rows, 7 rounds.
# `make bench-phases`: issue 18's bound rows under `perf record`, each sample named by the template
# statement it ran in (bench/phases.lua; needs perf, about 220 s); `QUICK=1`: the quick lengths, about 50 s;
# `FDB_WARM=1`: warm calls back to back (no flush), results/bench/phases-warm-<machine>[-quick].
# `make bench-history`: issue 18's bound rows over every committed `make bench` run of this machine,
# read back from git (bench/history.lua; seconds, measures nothing): results/bench/history-<machine>.{md,svg,png}.
LUAJIT     ?= luajit
GNUPLOT    ?= gnuplot
FDB_CFLAGS := -std=c11 -O3 -march=native -ffp-contract=fast -fopenmp -fPIC -Wall -Wextra -D_GNU_SOURCE -Iruntime -Ibench
FDB_SRC    := bench/bw.c bench/stream.c bench/vanilla.c bench/util.c
FDB_HDR    := bench/bw.h bench/stream.h bench/vanilla.h bench/util.h bench/dtype.h runtime/flashdecode.h

.PHONY: bench bench-check bench-lib bench-plot bench-paged bench-uneven bench-features bench-stream bench-phases bench-isa bench-fast bench-builds bench-history

bench-lib: $(B)/libfdbench.so
$(B)/libfdbench.so: $(FDB_SRC) $(FDB_HDR) bench/bench.mk
	@mkdir -p $(B)
	$(CC) $(FDB_CFLAGS) -shared $(FDB_SRC) -lm -o $@

$(B)/check_vanilla: bench/check_vanilla.c $(FDB_SRC) $(FDB_HDR)
	@mkdir -p $(B)
	$(CC) $(FDB_CFLAGS) bench/check_vanilla.c $(FDB_SRC) -lm -o $@

bench-check: $(B)/check_vanilla
	$(B)/check_vanilla

# The driver writes results/bench/<machine>[-quick].{md,tsv} and the gnuplot
# scripts it lists in $(B)/bench/plots.list; they render the SVG and PNG charts.
FDB_PLOT_CMD = for f in $$(cat $(B)/bench/plots.list 2>/dev/null); do \
	  echo "gnuplot $$f"; $(GNUPLOT) "$$f" || exit 1; done

bench: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT=0 FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so $(LUAJIT) tuner/bench.lua
	@$(FDB_PLOT_CMD)
	@$(MAKE) --no-print-directory B=$(B) bench-paged
	@$(MAKE) --no-print-directory B=$(B) bench-uneven
	@$(MAKE) --no-print-directory B=$(B) bench-features
	@$(MAKE) --no-print-directory B=$(B) bench-stream

# Paged vs dense at the same length and plan: results/bench/paged-<machine>[-quick].{md,svg,png}.
bench-paged: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so \
	  FDB_CMD="$(if $(filter-out 0,$(QUICK)),QUICK=$(QUICK) )make bench-paged" $(LUAJIT) bench/paged.lua

# Uneven batches against the total-key prediction: results/bench/uneven-<machine>[-quick].{md,svg,png}.
bench-uneven: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so \
	  FDB_CMD="$(if $(filter-out 0,$(QUICK)),QUICK=$(QUICK) )make bench-uneven" $(LUAJIT) bench/uneven.lua

# Shape features against plain decode: results/bench/features-<machine>[-quick].{md,svg,png}.
bench-features: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so \
	  FDB_CMD="$(if $(filter-out 0,$(QUICK)),QUICK=$(QUICK) )make bench-features" $(LUAJIT) bench/features.lua

# Re-render the charts of the last run.
bench-plot:
	@$(FDB_PLOT_CMD)

# Issue 18's bound rows beside the streaming probe on the same buffers:
# results/bench/stream-<machine>[-quick].{md,svg,png}.
bench-stream: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so \
	  FDB_CMD="$(if $(filter-out 0,$(QUICK)),QUICK=$(QUICK) )make bench-stream" $(LUAJIT) bench/stream.lua

# Issue 18's bound rows by template statement (perf cpu-clock samples of cc kernels built with
# #line and -g): results/bench/phases-<machine>[-quick].{md,svg,png}.
bench-phases: lib $(B)/libfdbench.so
	OMP_WAIT_POLICY=passive FDB_PLOT_DIR=$(B)/bench FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so \
	  FDB_CMD="$(if $(filter-out 0,$(QUICK)),QUICK=$(QUICK) )make bench-phases" $(LUAJIT) bench/phases.lua

# Issue 18's bounds over the committed runs (git history of results/bench/<machine>.tsv).
bench-history: $(B)/fdgen
	$(LUAJIT) bench/history.lua $$($(B)/fdgen machine) results/bench $(B)/bench/history

# Two plans of one shape that differ in one choice, cold and interleaved, at 1 thread and all
# cores (bench/ab.c; ROUNDS overrides):
# `make bench-isa`: the bf16 grouped shapes, A the planner's isa, B FD_ISA_AVX512_BF16 forced
# (a CPU with AVX512-BF16; ISA_A, ISA_B override): results/bench/isa-<machine>.md;
# `make bench-fast`: Llama-3.1-8B int8 KV (16k, 64k) and bf16 (16k), int8 KV at groups of 2, 7, 8
# and 16 heads (Gemma-2-9B, Qwen2.5-7B, the MQA batch, Falcon-40B), the MQA batch and Falcon-40B
# bf16, A the default precision,
# B fast precision where served (int8: AVX512-VNNI, or AVX2's int16 plane), with the machine's committed tuned
# table where there is one: results/bench/fast-<machine>.md.
$(B)/ab: bench/ab.c $(FDB_SRC) $(FDB_HDR) $(B)/libflashdecode.a
	$(CC) $(FDB_CFLAGS) bench/ab.c $(FDB_SRC) $(B)/libflashdecode.a -lm -lpthread -ldl -o $@

# Two builds of the library, one plan per row (bench/builds.c): `make bench-builds REV=<revision>`
# builds the library of git revision REV (git archive) under $(B)/rev and times its kernels (A)
# against this tree's (B) on issue 18's bound shapes, MHA-32 f16 (the memory-bound control) and Llama q8_0 / q4_0,
# B taking A's plan, interleaved; warm (K/V in the last-level cache), or MODE=cold at the bound
# lengths; ROUNDS rounds (101). Prints the table; cold, then the same split by the memory's level
# (bench/levels.lua over the rounds kept in $(B)/builds-rounds.tsv).
# `$(B)/builds LIB_A LIB_B [ROUNDS [warm|cold]]` takes any two builds; FDB_ROWS, FDB_BATCH,
# FDB_LEN and FDB_CHUNK, FDB_TILE, FDB_SPLITS, FDB_ISA (A's plan forced) narrow a run,
# FDB_ROUNDS_TSV keeps a cold run's rounds (bench/builds.c).
$(B)/builds: bench/builds.c $(FDB_SRC) $(FDB_HDR)
	$(CC) $(FDB_CFLAGS) bench/builds.c $(FDB_SRC) -lm -ldl -o $@

bench-builds: lib $(B)/builds
	@test -n "$(REV)" || { echo "bench-builds: set REV to a git revision, e.g. make bench-builds REV=HEAD~1"; exit 2; }
	rm -rf $(B)/rev && mkdir -p $(B)/rev && git archive --format=tar $(REV) | tar -x -C $(B)/rev
	$(MAKE) -C $(B)/rev --no-print-directory lib
	$(if $(filter cold,$(MODE)),FDB_ROUNDS_TSV=$(B)/builds-rounds.tsv) \
	  $(B)/builds $(B)/rev/build/libflashdecode.so $(B)/libflashdecode.so $(or $(ROUNDS),101) $(or $(MODE),warm)
	$(if $(filter cold,$(MODE)),@echo; $(LUAJIT) bench/levels.lua $(B)/builds-rounds.tsv)

bench-isa: $(B)/ab $(B)/fdgen
	$(B)/ab isa $(or $(ISA_A),0) $(or $(ISA_B),4) $(or $(ROUNDS),11) > $(B)/isa.md
	mkdir -p results/bench && cp $(B)/isa.md results/bench/isa-$$($(B)/fdgen machine).md

bench-fast: $(B)/ab $(B)/fdgen
	m=$$($(B)/fdgen machine); t=results/tuned/$$m.tsv; [ -f $$t ] || t=; \
	  $(B)/ab precision $(or $(ROUNDS),11) "$$t" > $(B)/fast.md
	mkdir -p results/bench && cp $(B)/fast.md results/bench/fast-$$($(B)/fdgen machine).md
