# The tuner, included by the main Makefile (uses B, LUAJIT).
# `make tune`: install what is missing, build, tune tuner/shapes/default.lua on
#   this machine (a time budget keeps it under 10 minutes on 2 cores), write
#   results/tuned/<machine>.tsv, its log (.log, resumable) and
#   results/<machine>/flashdecode_tuned.h, and print the summary.
#   SHAPES=file: another shape set; QUICK=1: a short run (lengths up to 4096);
#   TUNE_BUDGET=s: seconds of measuring; TUNE_CACHE=warm: warm-cache timing.
#   The cold timings flush the caches with the benchmark's flush ($(B)/libfdbench.so).
# `make export`: re-export the machine's table to its header.
# `make tune-verify`: re-measure the machine's table against the heuristic.
# `make test-tune`: the tuner and export tests (tests/test_tune.sh).
.PHONY: tune export tune-verify test-tune tune-sweep

# What every timing tuner script needs: the library it times and the
# benchmark library whose flush makes its cold timings.
TUNER_DEPS = deps lib $(B)/fdgen $(B)/libfdbench.so
TUNER_ENV  = FD_LIB=$(B)/libflashdecode.so FDB_LIB=$(B)/libfdbench.so

tune: $(TUNER_DEPS)
	$(TUNER_ENV) FDGEN=$(B)/fdgen $(LUAJIT) tuner/tune.lua

export: deps $(B)/fdgen
	$(B)/fdgen export results/tuned/$$($(B)/fdgen machine).tsv -o results/$$($(B)/fdgen machine)/flashdecode_tuned.h

tune-verify: $(TUNER_DEPS)
	$(TUNER_ENV) $(LUAJIT) tuner/verify.lua results/tuned/$$($(B)/fdgen machine).tsv

test-tune: all $(B)/libfdbench.so
	bash tests/test_tune.sh

# `make tune-sweep`: time every configuration of each row of SHAPES (default
# tuner/shapes/unseen.lua), re-measure the best few with the tuned table's pick
# and the heuristic in paired rounds, and write results/tuned/sweep-<machine>.md
# (tuner/sweep.lua; SWEEP_TABLE, SWEEP_TOP, SWEEP_ROUNDS, SWEEP_PRUNE, SWEEP_PROCS).
SWEEP_SHAPES = $(if $(SHAPES),$(SHAPES),tuner/shapes/unseen.lua)
tune-sweep: $(TUNER_DEPS)
	$(TUNER_ENV) $(LUAJIT) tuner/sweep.lua $(SWEEP_SHAPES)

# `make tune-model-eval`: the cost model on shapes left out of its fit
#   (tuner/model_eval.lua): the model's pick, the tuned pick and the heuristic
#   timed interleaved per row of results/tuned/<machine>.tsv (and
#   <machine>-unseen.tsv); writes results/tuned/model-<machine>.md.
.PHONY: tune-model-eval
tune-model-eval: $(TUNER_DEPS)
	$(TUNER_ENV) $(LUAJIT) tuner/model_eval.lua
