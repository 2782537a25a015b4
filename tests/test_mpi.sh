#!/usr/bin/env bash
# tests/test_mpi under mpirun with 1, 2, 3 and 4 ranks (--oversubscribe: more ranks than
# cores; --allow-run-as-root: CI runs as root). Each rank prints "rank R of N: P passed,
# F failed"; this sums them into one closing "P passed, F failed" line. A run that hangs
# is killed after 300 s; a run where a rank did not report counts as a failure.
# Without MPI: a message and "0 passed, 0 failed".
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  echo "skipped: no MPI (apt-get install openmpi-bin libopenmpi-dev)"
  echo "0 passed, 0 failed"
  exit 0
fi
if [ ! -x "$B/test_mpi" ]; then
  echo "FAIL - $B/test_mpi is missing (make mpi test-mpi)"; echo "0 passed, 1 failed"; exit 1
fi
pass=0; fail=0; log=$(mktemp)
rank_line='^rank [0-9]+ of [0-9]+: [0-9]+ passed, [0-9]+ failed'
for n in 1 2 3 4; do
  timeout 300 mpirun --oversubscribe --allow-run-as-root -np "$n" "$B/test_mpi" >"$log" 2>&1
  rc=$?
  grep -v -E "$rank_line" "$log"
  p=0; f=0; ranks=0
  while read -r _ _ _ _ rp _ rf _; do
    p=$((p + rp)); f=$((f + rf)); ranks=$((ranks + 1))
  done < <(grep -E "$rank_line" "$log")
  if [ "$ranks" -ne "$n" ]; then
    echo "FAIL - np $n: $ranks of $n ranks reported (exit $rc)"; f=$((f + 1))
  elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL - np $n: mpirun exit $rc"; f=$((f + 1))
  fi
  echo "np=$n, $n ranks: $p passed, $f failed"
  pass=$((pass + p)); fail=$((fail + f))
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
