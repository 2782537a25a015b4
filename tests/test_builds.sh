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

# The tool's rows, as it names them when FDB_ROWS names none of them.
FDB_ROWS=no-such-row "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 1 >"$out" 2>"$err"; rc=$?
check "FDB_ROWS naming only an unknown row: exit 2, the rows listed" '[ $rc -eq 2 ] && grep -q "no row .no-such-row.; the rows: llama3-8b-bf16" "$err"'
nrows=$(sed 's/.*the rows://' "$err" | wc -w)
# Each table row: | shape | batch | kv_len | `key A` | `key B` | ...; the same build on
# both sides, so every row's keys are equal; $2: the rows expected (default: all of them).
rows_ok() { awk -F'|' -v want="${2:-$nrows}" '/^\| [a-z]/ && $2 !~ /shape/ { n++; if ($5 != $6) bad++ } END { exit !(n == want && bad == 0) }' "$1"; }
"$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 3 >"$out" 2>"$err"; rc=$?
check "A/A warm: exit 0" '[ $rc -eq 0 ]'
check "A/A warm: all $nrows rows, each B key equal to its A key" 'rows_ok "$out"'
cat "$out"

# FDB_TILE where it divides the row's group: Llama (G 4) at tile 2, MHA (G 1) at its own tile 1
FDB_ROWS=llama3-8b-bf16,mha-32-f16 FDB_LEN=300 FDB_TILE=2 \
  "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 >"$out" 2>"$err"; rc=$?
check "FDB_TILE=2 on Llama and MHA: exit 0, two rows" '[ $rc -eq 0 ] && rows_ok "$out" 2'
check "Llama's key at tile 2, MHA's at tile 1 (key digits 9-10)" \
  'grep -Eq "^\| llama3-8b-bf16 .*\| \`[0-9]{8}02" "$out" && grep -Eq "^\| mha-32-f16 .*\| \`[0-9]{8}01" "$out"'

# The overrides: one row at a forced plan, batch and length; bad values refused.
FDB_ROWS=falcon-40b-bf16 FDB_BATCH=1 FDB_LEN=300 FDB_CHUNK=64 FDB_TILE=16 \
  "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 >"$out" 2>"$err"; rc=$?
check "FDB_ROWS, FDB_BATCH, FDB_LEN, FDB_CHUNK, FDB_TILE: exit 0, one row" '[ $rc -eq 0 ] && rows_ok "$out" 1'
check "the row at batch 1, kv_len 300, its key of chunk 64 (digits 2-5 0064)" \
  'grep -Eq "^\| falcon-40b-bf16 \| 1 \| 300 \| \`10064064" "$out"'
FDB_ROWS=llama3-8b-bf16,nope "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 >"$out" 2>"$err"; rc=$?
check "FDB_ROWS naming no row: exit 2, the rows listed" '[ $rc -eq 2 ] && grep -q "no row .nope.; the rows: llama3-8b-bf16" "$err"'
FDB_CHUNK=64k "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 >"$out" 2>"$err"; rc=$?
check "FDB_CHUNK not an integer: exit 2, said" '[ $rc -eq 2 ] && grep -q "FDB_CHUNK=.64k.: want an integer" "$err"'
FDB_ISA=12 "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 >"$out" 2>"$err"; rc=$?
check "FDB_ISA out of range: exit 2, said" '[ $rc -eq 2 ] && grep -q "FDB_ISA=.12.: want an integer from 0 to 9" "$err"'

# Cold: each round kept in the rounds file with its read bandwidth; bench/levels.lua reports it.
rounds=$(mktemp)
FDB_ROWS=mqa-b8-bf16 FDB_LEN=512 FDB_ROUNDS_TSV="$rounds" \
  "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 3 cold >"$out" 2>"$err"; rc=$?
check "cold with FDB_ROUNDS_TSV: exit 0, one row with its read GB/s" \
  '[ $rc -eq 0 ] && rows_ok "$out" 1 && grep -Eq "^\| mqa-b8-bf16 .*\| [0-9]+\.[0-9] \|$" "$out"'
check "the rounds file: the column line and 3 rounds, each read GB/s above 0" \
  '[ "$(grep -c "^mqa-b8-bf16	[0-2]	" "$rounds")" -eq 3 ] && awk -F"\t" "/^mqa/ && !(\$3 > 0) { bad++ } END { exit bad > 0 }" "$rounds"'
luajit bench/levels.lua "$rounds" >"$out" 2>"$err"; rc=$?
check "bench/levels.lua on it: exit 0, the row over all rounds" '[ $rc -eq 0 ] && grep -q "^| mqa-b8-bf16 | all | 3 |" "$out"'
FDB_ROUNDS_TSV="$rounds" "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 warm >"$out" 2>"$err"; rc=$?
check "FDB_ROUNDS_TSV on a warm run: exit 2, said" '[ $rc -eq 2 ] && grep -q "takes the rounds of a cold run" "$err"'
FDB_ROUNDS_TSV=/nonexistent/dir/r.tsv "$B/builds" "$B/libflashdecode.so" "$B/libflashdecode.so" 2 cold >"$out" 2>"$err"; rc=$?
check "FDB_ROUNDS_TSV unwritable: exit 2, said" '[ $rc -eq 2 ] && grep -q "cannot write it" "$err"'
rm -f "$rounds"

make --no-print-directory B="$B" bench-builds >"$out" 2>&1; rc=$?
check "make bench-builds without REV: exit non-zero, said" '[ $rc -ne 0 ] && grep -q "set REV" "$out"'
make --no-print-directory B="$B" bench-builds REV=HEAD ROUNDS=1 >"$out" 2>&1; rc=$?
check "make bench-builds REV=HEAD: HEAD built from git archive and timed, all $nrows rows" '[ $rc -eq 0 ] && rows_ok "$out"'
tail -n 6 "$out"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
