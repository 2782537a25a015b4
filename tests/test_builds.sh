#!/usr/bin/env bash
# The two-builds A/B tool (bench/builds.c) and `make bench-builds`: usage and
# bad libraries refused, a build against itself gives every row with equal
# keys, and the make target builds a git revision and times it. Asserts no speed.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
pass=0; fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - $1"; fi; }
out=$(mktemp); err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

"$B/builds" "$B/libflashdecode.so" >"$out" 2>"$err"; rc=$?
check "one library: usage, exit 2" '[ $rc -eq 2 ] && grep -q "usage: builds" "$err"'
"$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 3 lukewarm >"$out" 2>"$err"; rc=$?
check "a mode other than warm or cold: usage, exit 2" '[ $rc -eq 2 ]'
"$B/builds" "$B/no-such-lib.so" "$B/libflashdecode.so" 3 >"$out" 2>"$err"; rc=$?
check "a missing library: exit 1, said" '[ $rc -eq 1 ] && grep -q "^builds: " "$err"'

# Each table row: | shape | kv_len | `key A` | `key B` | ...; the same build on both sides.
rows_ok() { awk -F'|' '/^\| [a-z]/ && $2 !~ /shape/ { n++; if ($4 != $5) bad++ } END { exit !(n == 4 && bad == 0) }' "$1"; }
"$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 3 >"$out" 2>"$err"; rc=$?
check "A/A warm: exit 0" '[ $rc -eq 0 ]'
check "A/A warm: 4 rows, each B key equal to its A key" 'rows_ok "$out"'
cat "$out"

make --no-print-directory B="$B" bench-builds >"$out" 2>&1; rc=$?
check "make bench-builds without REV: exit non-zero, said" '[ $rc -ne 0 ] && grep -q "set REV" "$out"'
make --no-print-directory B="$B" bench-builds REV=HEAD ROUNDS=1 >"$out" 2>&1; rc=$?
check "make bench-builds REV=HEAD: HEAD built from git archive and timed, 4 rows" '[ $rc -eq 0 ] && rows_ok "$out"'
tail -n 6 "$out"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
