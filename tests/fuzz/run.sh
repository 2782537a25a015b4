#!/usr/bin/env bash
# Run every libFuzzer target built in DIR for SECONDS each, one after the
# other, from the seeds in tests/fuzz/corpus/<target>/ plus what earlier runs
# found (DIR/corpus/<target>/). Prints per target its executions, crashes
# (crashes, leaks, out-of-memory; a broken invariant aborts, so it counts
# here) and hangs (an input running over FUZZ_TIMEOUT seconds), each distinct
# finding and where its inputs are, and ends with "N passed, N failed" over
# the targets (a target passes with no crash and no hang).
# Usage: tests/fuzz/run.sh DIR SECONDS [TARGET...]
set -u
cd "$(dirname "$0")/../.."
dir=${1:?usage: run.sh DIR SECONDS [TARGET...]}
secs=${2:?usage: run.sh DIR SECONDS [TARGET...]}
shift 2
timeout=${FUZZ_TIMEOUT:-10}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
pass=0; fail=0

# The longest input a target takes: whole tables for the loader, keys otherwise.
max_len() { case $1 in fuzz_table) echo 8192;; *) echo 64;; esac; }

# Fuzz target $1 for $secs seconds; print its line and record pass or fail.
# Fork mode: a crash or hang is saved and counted, and fuzzing goes on.
run_one() {
  local t=$1 bin=$dir/$1 work=$dir/corpus/$1 art=$dir/artifacts/$1 log=$dir/$1.log
  if [ ! -x "$bin" ]; then echo "FAIL - $t: $bin not built (make fuzz-build)"; fail=$((fail + 1)); return; fi
  mkdir -p "$work"; rm -rf "$art"; mkdir -p "$art"
  "$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$secs" \
    -timeout="$timeout" -rss_limit_mb=2048 -max_len="$(max_len "$t")" -artifact_prefix="$art/" \
    "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  local rc=$? last execs crashes hangs
  last=$(grep -a -E '^#[0-9]+: cov:' "$log" | tail -n 1)   # the last status line: total executions
  execs=$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")
  crashes=$(find "$art" -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' | wc -l)
  hangs=$(find "$art" -name 'timeout-*' | wc -l)
  echo "$t: ${execs:-0} executions in $secs s, $crashes crashes, $hangs hangs (corpus $(ls "$work" | wc -l) inputs)"
  if [ "$rc" -eq 0 ] && [ -n "$last" ] && [ "$crashes" -eq 0 ] && [ "$hangs" -eq 0 ]; then pass=$((pass + 1)); return; fi
  fail=$((fail + 1))
  echo "FAIL - $t: exit $rc$([ -n "$last" ] || echo ", no status line"); its findings (numbers as N):"
  local f
  for f in $(ls "$art" | head -n 50); do   # replay saved inputs: each distinct diagnostic, counted
    "$bin" -timeout="$timeout" "$art/$f" 2>&1 | grep -a -m 1 -E 'INVARIANT BROKEN|ERROR: |runtime error|ALARM' |
      sed -E 's/==[0-9]+== ?//; s/[0-9]+/N/g' | cut -c 1-130
  done | sort | uniq -c | sort -rn | sed 's/^/    /'
  echo "    inputs in $art/, log $log"
}

for t in "${targets[@]}"; do run_one "$t"; done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
