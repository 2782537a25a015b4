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
suite "benchmark's vanilla baseline vs a double loop" "$B/check_vanilla"
suite "bad input, tuned tables, lifetime, concurrency, 64-bit indexing" "$B/test_errors"
suite "tuner, tuned table, exported header (gcc -O2, tcc) vs JIT" bash tests/test_tune.sh
export FD_TEST_CACHE_DIR="$B/san/cache"
for t in test_kernels test_api test_errors; do
  suite "$t under AddressSanitizer + UndefinedBehaviorSanitizer" "$B/san/$t"
done

rm -f "$log"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
