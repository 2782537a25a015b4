#!/usr/bin/env bash
# Run every test suite, print each suite's tally and the total; exit non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
total_pass=0; total_fail=0; log=$(mktemp)

# Run one suite: its output is shown and its closing "N passed, N failed" line counted.
suite() {
  local name=$1; shift
  echo "== $name"
  "$@" >"$log" 2>&1
  local rc=$?
  cat "$log"
  local line p f
  line=$(grep -E '^([A-Za-z_-]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 | sed -E 's/^[A-Za-z_-]+: //')
  if [ -z "$line" ]; then
    echo "FAIL - $name: exit $rc without a result line"; total_fail=$((total_fail + 1)); return
  fi
  p=$(echo "$line" | cut -d' ' -f1); f=$(echo "$line" | cut -d' ' -f3)
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL - $name: exit $rc"; total_fail=$((total_fail + 1))
  fi
}

for lua in lua5.4 luajit; do
  for t in tests/test_*.lua; do suite "$t ($lua)" "$lua" "$t"; done
done
suite "compile every default variant with tcc and gcc -Werror" bash tests/compile_variants.sh "$B/gen/default"
suite "fdgen command line" bash tests/test_cli.sh
suite "kernels vs double reference (tcc)" "$B/test_kernels"
suite "public API vs double reference (tcc, cc; 1-4 threads)" "$B/test_api"
suite "benchmark's vanilla baseline vs a double loop; the streaming probe reads each element once" "$B/check_vanilla"
suite "bad input, tuned tables, lifetime, concurrency, 64-bit indexing" "$B/test_errors"
suite "tuned tables refused whole, upper bounds" "$B/test_tables"
suite "cost model: table model lines exact or refused naming the line, planner uses it only where no row fits, forced options and deterministic mode win, its pick vs double reference" "$B/test_model"
suite "concurrency, destroy races, cc fallback, kernel-cache bound" "$B/test_concurrency"
suite "process-wide kernel store: second context compiles nothing, spare bound" "$B/test_jit"
suite "test_concurrency under ThreadSanitizer" env TSAN_OPTIONS="halt_on_error=1 exitcode=66" "$B/tsan/test_concurrency"
suite "fd_merge_states vs attention over the union, in double" "$B/test_merge"
suite "paged KV vs double reference and vs dense bit for bit (each ISA, dtype, mode, page size), refusals" "$B/test_paged"
suite "several query tokens (q_len 1-16) and FD_NEW_KV vs double reference per token (each ISA, dtype, mode, splits), refusals" "$B/test_tokens"
suite "shared KV: cascade (shared prefix + suffixes + fd_merge_states) vs the concatenation; mask mode; refusal" "$B/test_shared"
suite "work items on uneven batches (one 64k row + seven 1k, mirror, uniform; 1-4 threads): each key once, long rows cut for balance" "$B/test_schedule"
suite "sliding window, sink tokens, learned sink logits and ALiBi vs double reference per token (each ISA, dtype, q_len 1/3/4, splits, paged with freed pages); a 4k window over 128k visits 4k keys; refusals" "$B/test_window"
suite "per-channel K scales (int8/fp8, channels 1000x apart) and beam indirection (every KV dtype, beam_src patterns) vs double reference per token (each ISA, mode, q_len 1/3, window, splits, paged); refusals" "$B/test_kpc_beams"
suite "the per-key feature recipe: a dummy feature in a scratch tree reaches key, generator, planner, tuner, exporter" bash tests/test_recipe.sh
suite "MSD int8 scores (q in 2/3 int8 planes, vpdpbusd) vs double reference: score error per plane count, every mode, bhsd/bshd/paged, odd groups, splits, q_len 3, per-row and per-channel K scales; refusals" "$B/test_msd"
suite "fast precision (bf16 weights by vdpbf16ps on AVX512-BF16; 2 MSD planes for int8 K and V on AVX512-VNNI) vs double reference: every mode, bhsd/bshd/paged, odd groups and head_dims, splits, q_len 3, tcc and cc; the default and fast errors on the Llama group; a tuned int8 row; FAST as a permission; refusals" "$B/test_fast"
suite "fast precision through the exported header: a precision-1 row exported, compiled by gcc and tcc, vs double reference" env B="$B" bash tests/test_fast_export.sh
suite "context-parallel decode over MPI, np 1-4" env B="$B" bash tests/test_mpi.sh
suite "NaN/Inf in q, K, V, mask vs double reference (each ISA, splits 1/4/64, tcc and cc), check_inputs" "$B/test_nonfinite"
suite "deterministic mode: same bits for threads 1-7, batches, repeats, tcc and cc; default within f32 rounding" "$B/test_determinism"
suite "tuner, tuned table, exported header (gcc -O2, tcc) vs JIT" bash tests/test_tune.sh
suite "make bench-peers without ggml: the harness and driver on a tiny shape, its report" env B="$B" bash tests/test_peers.sh
suite "make bench-builds: two builds' kernels under one plan; usage and missing libraries refused, a build against itself, HEAD from git archive" env B="$B" bash tests/test_builds.sh
suite "LuaJIT require \"flashdecode\" vs double reference, from a temp dir" env FD_LIB="$PWD/$B/libflashdecode.so" luajit tests/luajit_module.lua
suite "Python module vs numpy float64 reference" env FD_LIB="$B/libflashdecode.so" PYTHONPATH=python /usr/bin/python3 tests/test_python.py
suite "install, pkg-config, exported symbols, uninstall" bash tests/test_install.sh
suite "libFuzzer: table loader, key codec, fd_kernel_source (4 s each, ASan + UBSan)" bash tests/fuzz/run.sh "$B/fuzz" "${FUZZ_SHORT_S:-4}"
export FD_TEST_CACHE_DIR="$B/san/cache"
for t in test_kernels test_api test_errors test_merge test_tables test_model test_concurrency test_nonfinite test_determinism test_paged test_tokens test_shared test_schedule test_window test_kpc_beams test_msd test_fast; do
  suite "$t under AddressSanitizer + UndefinedBehaviorSanitizer" "$B/san/$t"
done

rm -f "$log"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
