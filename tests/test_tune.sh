#!/usr/bin/env bash
# The tuner and the exported header: a tiny shape set tuned end to end,
# interrupted and resumed from its log, tables from another CPU refused (Lua
# loader and fd_create), `fdgen export` rewritten only on change, and a
# program compiled against the exported header with gcc -O2 (and tcc), no
# library linked, giving the JIT path's outputs for every row and refusing
# the bad shapes and arguments the library refuses, case by case; batches of
# uneven lengths through the header's fdt_run and the library's exec.c giving
# the same work items, item by item, and bit-identical outputs; then the same
# for this machine's table from `make tune` when it belongs to this build;
# search coverage and its log notes; the exhaustive sweep on a tiny row
# (report columns, resume, restart after a stop, a missing table).
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
LUAJIT=${LUAJIT:-luajit}
F=$B/fdgen
. tests/check.sh
export TUNE_PROGRESS=0
export FD_LIB=${FD_LIB:-$PWD/$B/libflashdecode.so} FDGEN=${FDGEN:-$F}   # the tuner runs this build
export FDB_LIB=${FDB_LIB:-$PWD/$B/libfdbench.so}                        # and flushes with its benchmark library

# Measurement lines of a log.
measurements() { grep -vc '^#' "$1"; }
# Tune the tiny set into $tmp/$1.{tsv,log,h}.
tune() { local n=$1; shift; env TUNE_TABLE="$tmp/$n.tsv" TUNE_BUDGET=5 "$@" "$LUAJIT" tuner/tune.lua "$tmp/tiny.lua"; }

cat > "$tmp/tiny.lua" <<'LUA'
return {
  { name = "tiny-gqa", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, q_dtype = "f32",
    kv_dtype = "f16", out_dtype = "f32", kv_len = { 200, 1024 } },
  { name = "tiny-mask", batch = 2, n_q_heads = 8, n_kv_heads = 2, head_dim = 32, q_dtype = "bf16",
    kv_dtype = "i8", out_dtype = "bf16", mask_mode = "mask", layout = "bshd", kv_len = { 300 }, lse = true },
  { name = "tiny-full", batch = 3, n_q_heads = 6, n_kv_heads = 3, head_dim = 80, q_dtype = "f16",
    kv_dtype = "fp8", out_dtype = "f16", mask_mode = "full", kv_len = { 100 } },
  { name = "tiny-paged", batch = 2, n_q_heads = 8, n_kv_heads = 2, head_dim = 64, q_dtype = "bf16",
    kv_dtype = "bf16", out_dtype = "bf16", layout = "paged", page_size = 16, kv_len = { 300 } },
  { name = "tiny-q3", batch = 2, n_q_heads = 8, n_kv_heads = 2, head_dim = 64, q_dtype = "f32",
    kv_dtype = "f16", out_dtype = "f32", q_len = 3, kv_len = { 200 } },
  { name = "tiny-shared", batch = 3, n_q_heads = 4, n_kv_heads = 1, head_dim = 32, q_dtype = "f32",
    kv_dtype = "f32", out_dtype = "f32", mask_mode = "full", features = 8, kv_len = { 100 } },
  { name = "tiny-e5m2", batch = 2, n_q_heads = 8, n_kv_heads = 2, head_dim = 32, q_dtype = "f32",
    kv_dtype = "e5m2", out_dtype = "bf16", layout = "paged", page_size = 16, kv_len = { 300 }, lse = true },
}
LUA

# --- 1. end to end --------------------------------------------------------
out=$(tune t 2>&1)
check "tiny tune exits 0" has "$out" "header $tmp/t.h (written)"
check "table has a row per shape and bucket" test "$(grep -c $'\ttiny-' "$tmp/t.tsv")" -eq 8
check "table ends with its row count" test "$(tail -n 1 "$tmp/t.tsv")" = $'end\t8'
check "table header is fd_tuned_table_header()" bash -c "$LUAJIT tuner/tuned.lua check $tmp/t.tsv"
check "summary names every bucket" test "$(grep '^tiny-' <<<"$out" | grep -vc ' searched ')" -eq 8
check "log holds a line per measurement" test "$(measurements "$tmp/t.log")" -ge 20
# The recheck (tuner/search.lua): the quick pass's fastest kernels re-timed in stages k1, k2, each a quick one.
check "the quick pass's fastest kernels re-timed (stage k1), each timed in the quick pass" \
  awk -F'\t' '$6 == "quick" { q[$2 "@" $3 "@" $7] = 1 } $6 == "k1" { k++; if (!(($2 "@" $3 "@" $7) in q)) bad = 1 }
    END { exit bad || k < 2 }' "$tmp/t.log"
check "tuned rows no slower than the heuristic (recorded)" \
  awk -F'\t' 'NR > 7 && $1 != "end" && $1 != "model" && $6 > 1.03 * $8 { print; bad = 1 } END { exit bad }' "$tmp/t.tsv"
check "ratio_ci: '-' or a kept winner's interval, below 1" \
  awk -F'\t' 'NR > 7 && $1 != "end" && $1 != "model" && !($10 == "-" || ($10 ~ /^[0-9.]+[.][.][0-9.]+$/ && substr($10, index($10, "..") + 2) + 0 <= 1)) {
    print; bad = 1 } END { exit bad }' "$tmp/t.tsv"
# Decision lines: 18 fields; a row has an interval exactly when the log kept its challenger, with that interval.
check "log decision lines have their 17 fields" \
  awk -F'\t' '$1 == "#decision" && NF != 18 { print; bad = 1 } END { exit bad }' "$tmp/t.log"
check "table intervals are the log's decisions" \
  awk -F'\t' 'FNR == NR { if ($1 == "#decision" && $17 == "challenger") ci[$3 "@" $4] = $11; next }
    FNR > 7 && $1 != "end" && $1 != "model" && $10 != (($1 "@" $2) in ci ? ci[$1 "@" $2] : "-") { print; bad = 1 } END { exit bad }' \
  "$tmp/t.log" "$tmp/t.tsv"
check "summary has the decision columns" has "$out" "ratio 95% CI"
# The cost model (tuner/model.lua, runtime/model.c): fitted on the log and written before the end line;
# fdgen predict (C) ranks exactly as tuner/model.lua predict (Lua) from the same features.
check "the table carries the cost model's lines" grep -q $'^model\tchunk\t' "$tmp/t.tsv"
check "make tune printed the model's fit" has "$out" "cost model: "
for spec in batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtype=f16,kv_len=3000 \
            batch=1,n_q_heads=12,n_kv_heads=1,head_dim=128,q_dtype=bf16,kv_dtype=bf16,out_dtype=bf16,kv_len=700 \
            batch=4,n_q_heads=16,n_kv_heads=16,head_dim=32,kv_dtype=i8,layout=paged,page_size=16,kv_len=20000 \
            batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtype=f16,softcap=30,features=alibi,window=1000,kv_len=3000; do
  pc=$($F predict --table "$tmp/t.tsv" --shape "$spec" --threads 2 2>&1)
  mi=$(sed -n 's/.*max isa \([0-9]\).*/\1/p' <<<"$pc")
  c=$(awk '$1 ~ /^[0-9]+$/ { print $2, $3 }' <<<"$pc")
  l=$($LUAJIT tuner/model.lua predict "$tmp/t.tsv" "$spec" --threads 2 --max-isa "${mi:-0}" 2>&1 | awk -F'\t' '{ print $3, $4 }')
  check "fdgen predict == tuner/model.lua predict: same configurations and scores ($spec)" \
    bash -c '[ -n "$1" ] && [ "$1" = "$2" ] || { printf "C:\n%s\nLua:\n%s\n" "$1" "$2"; exit 1; }' _ "$c" "$l"
  hc=$(awk '$1 == "heur" { print $2 }' <<<"$pc")
  dc=$(awk '$1 == "decision" { print $2, $3 }' <<<"$pc")
  dl=$($LUAJIT tuner/model.lua predict "$tmp/t.tsv" "$spec" --threads 2 --max-isa "${mi:-0}" --heuristic "$hc" 2>&1 |
       awk -F'\t' '$2 == "decision" { print $3, $4 }')
  check "fdgen predict == tuner/model.lua predict: the same decision from the heuristic's $hc ($spec)" \
    bash -c '[ -n "$1" ] && [ "$1" = "$2" ] || { printf "C: %s\nLua: %s\n" "$1" "$2"; exit 1; }' _ "$dc" "$dl"
done
cat > "$tmp/ctx.lua" <<'LUA'
package.path = "./?.lua;./gen/?.lua;./lua/?.lua;" .. package.path
local fd = require("flashdecode")
local ctx = fd.create { table = arg[1] }
io.write(fd.errmsg(ctx), "\n")
LUA
check "fd_create accepts the table" test -z "$($LUAJIT "$tmp/ctx.lua" "$tmp/t.tsv")"
n=$(measurements "$tmp/t.log")
out=$(tune t 2>&1)
check "a second run measures nothing" has "$out" "(0 measurements, $n reused from the log)"
check "a second run leaves the table and header" has "$out" "t.tsv (unchanged)"
check "  ... and the header" has "$out" "t.h (unchanged)"
check "a second run logs no decision twice" test -z "$(grep '^#decision' "$tmp/t.log" | sort | uniq -d)"

check "summary prints what the search covered per row" test "$(grep -cE '^tiny-.* searched [0-9]+/[0-9]+ kernels \([0-9]+ pruned\), [0-9]+ decomp\., [0-9]+ configs' <<<"$out")" -eq 8
check "log has a #coverage line per row, with its 11 fields" \
  awk -F'\t' '$1 == "#coverage" { n++; if (NF != 12) bad = 1 } END { exit bad || n != 8 }' "$tmp/t.log"
check "log's #pruned lines say why (tiny lengths prune long chunks)" grep -q $'^#pruned\t.*\tchunk 4096 >= 2 x the length' "$tmp/t.log"
check "a second run logs no note twice" test -z "$(grep -E '^#(pruned|coverage)' "$tmp/t.log" | sort | uniq -d)"

# --- 2. interrupted and resumed -------------------------------------------
tune r FD_TUNE_STOP_AFTER=12 >"$tmp/r1.out" 2>&1
rc=$?
check "FD_TUNE_STOP_AFTER stops with exit 3" test "$rc" -eq 3
check "the stopped run says how to resume" grep -q "run again to resume" "$tmp/r1.out"
check "the stopped run logged 12 measurements" test "$(measurements "$tmp/r.log")" -eq 12
check "the stopped run wrote no table" test ! -e "$tmp/r.tsv"
out=$(tune r 2>&1)
check "the resumed run reuses the 12" has "$out" "12 reused from the log"
check "no measurement logged twice" test -z "$(grep -v '^#' "$tmp/r.log" | cut -f1-7 | sort | uniq -d)"
check "the resumed run writes the table" bash -c "$LUAJIT tuner/tuned.lua check $tmp/r.tsv"

# --- 3. refusals -----------------------------------------------------------
sed 's/^cpu\t.*/cpu\tOther CPU 9000/' "$tmp/t.tsv" >"$tmp/other.tsv"
out=$($LUAJIT tuner/tuned.lua check "$tmp/other.tsv" 2>&1)
check "Lua loader refuses a table from another CPU" has "$out" "other.tsv:5: refused: cpu is 'Other CPU 9000'"
out=$($LUAJIT "$tmp/ctx.lua" "$tmp/other.tsv")
check "fd_create refuses a table from another CPU" has "$out" "refused: line 5 (cpu)"
sed '8s/\t[0-9]*\t/\tx\t/' "$tmp/t.tsv" >"$tmp/bad.tsv"
out=$($F export "$tmp/bad.tsv" -o "$tmp/bad.h" 2>&1)
check "export refuses a malformed row naming file, line and field" has "$out" "bad.tsv:8: field bucket 'x'"
sed '8s/\t[^\t]*$/\t0.9..x/' "$tmp/t.tsv" >"$tmp/badci.tsv"
out=$($LUAJIT tuner/tuned.lua check "$tmp/badci.tsv" 2>&1)
check "Lua loader refuses a malformed ratio_ci naming file, line and field" has "$out" "badci.tsv:8: field ratio_ci '0.9..x'"
out=$($LUAJIT "$tmp/ctx.lua" "$tmp/badci.tsv")
check "fd_create refuses a malformed ratio_ci naming line and field" has "$out" "line 8: ratio_ci '0.9..x'"
sed '8s/\t[^\t]*$//' "$tmp/t.tsv" >"$tmp/noci.tsv"
out=$($LUAJIT tuner/tuned.lua check "$tmp/noci.tsv" 2>&1)
check "Lua loader refuses a row without ratio_ci" has "$out" "noci.tsv:8: has 9 fields, want 10"
sed '8s/\t[^\t]*$/\t0.912..0.951/' "$tmp/t.tsv" >"$tmp/ci.tsv"
cat > "$tmp/roundtrip.lua" <<'LUA'
package.path = "./?.lua;./gen/?.lua;./lua/?.lua;" .. package.path
local tuned, files = require("tuner.tuned"), require("files")
local text = files.read(arg[1])
local t = tuned.load(arg[1])
io.write(tuned.format(t.header, t.rows, t.model) == text and "same" or "differs", "\n")
LUA
check "a table read and written again is the same text (with an interval)" \
  test "$($LUAJIT "$tmp/roundtrip.lua" "$tmp/ci.tsv" 2>&1)" = same
check "fd_create accepts a row with an interval" test -z "$($LUAJIT "$tmp/ctx.lua" "$tmp/ci.tsv")"
head -n 8 "$tmp/t.tsv" >"$tmp/cut.tsv"
out=$($LUAJIT tuner/tuned.lua check "$tmp/cut.tsv" 2>&1)
check "a table without its end line is refused" has "$out" "truncated (no end line)"

# The cold timings flush with the benchmark's flush (bench/bw.c through
# bench/lib.lua): without that library a cold tune stops before measuring;
# a warm one needs no flush and runs.
out=$(tune nofl FDB_LIB=/nonexistent/libfdbench.so 2>&1)
check "a cold tune without libfdbench stops, naming it" has "$out" "bench: cannot load /nonexistent/libfdbench.so"
check "  ... and writes no table" test ! -e "$tmp/nofl.tsv"
# A flush buffer that cannot be allocated (2^40 MiB) stops the run too, and
# no configuration is logged as failed for it.
out=$(tune nomem FDB_FLUSH_MIB=1099511627776 2>&1)
check "a cold tune without memory for its flush stops, saying so" has "$out" "out of memory for the cache flush buffer"
check "  ... and writes no table" test ! -e "$tmp/nomem.tsv"
check "  ... and logs no failed configuration" bash -c "! grep -q 'flush' '$tmp/nomem.log' 2>/dev/null"
out=$(tune warm FDB_LIB=/nonexistent/libfdbench.so TUNE_CACHE=warm FD_TUNE_STOP_AFTER=3 2>&1)
check "a warm tune runs without it" has "$out" "run again to resume"

# --- 4. export: the header against the JIT ---------------------------------
# Export TABLE to HEADER, build the header-only program (gcc -O2, and tcc) and
# the JIT program, and compare every row.
compare_table() {
  local name=$1 table=$2 h=$tmp/$1.h
  check "$name: export" $F export "$table" -o "$h"
  check "$name: gcc -O2 compiles a program against the header alone" \
    gcc -std=c11 -O2 -Wall -Wextra -Werror -pedantic -DFDT_HEADER="\"$h\"" tests/test_export.c -lm -o "$tmp/$name.aot"
  check "$name: ... with no libtcc or Lua linked" bash -c "! ldd $tmp/$name.aot | grep -Eq 'tcc|lua'"
  check "$name: tcc compiles it too" tcc -DFDT_HEADER="\"$h\"" tests/test_export.c -lm -o "$tmp/$name.tcc"
  check "$name: the JIT program builds" gcc -std=c11 -O2 -D_GNU_SOURCE -DFDT_JIT -DFDT_HEADER="\"$h\"" -Iruntime \
    -Itools/fdgen tests/test_export.c tools/fdgen/ref.c "$B/libflashdecode.a" -ltcc -llua5.4 -ldl -lpthread -lm -o "$tmp/$name.jit"
  check "$name: the header runs every row (gcc -O2)" "$tmp/$name.aot" "$tmp/$name.gcc.bin"
  check "$name: the header runs every row (tcc)" "$tmp/$name.tcc" "$tmp/$name.tcc.bin"
  check "$name: gcc -O2 header == JIT for every row" "$tmp/$name.jit" "$table" "$tmp/$name.gcc.bin"
  check "$name: tcc header == JIT for every row" "$tmp/$name.jit" "$table" "$tmp/$name.tcc.bin"
  check "$name: fdt_run refuses what fd_plan_create + fd_run refuse (code, field, nothing written)" \
    "$tmp/$name.jit" --refusals
}
compare_table tiny "$tmp/t.tsv"
out=$($F export "$tmp/t.tsv" -o "$tmp/tiny.h" 2>&1)
check "export rewrites nothing when nothing changed" has "$out" "(unchanged)"
check "header has the banner" grep -q "do not edit" "$tmp/tiny.h"
# (LuaJIT with -joff: its JIT crashes the generator now and then, tests/test_gen.lua)
for lua in lua5.4 "$LUAJIT -joff"; do
  h=$tmp/tiny.${lua%% *}.h
  check "gen/fdgen.lua export on $lua writes the same header" \
    bash -c "$lua gen/fdgen.lua export $tmp/t.tsv -o $h 2>/dev/null && cmp $tmp/tiny.h $h"
done
# llama.cpp's block KV dtypes through the header: beside each f16 row a copy
# for q8_0 and beside each bf16 row one for q4_0 (the signature's kv name and
# the key's kv_dtype digit changed; head_dims 64), header against the JIT.
awk -F'\t' -v OFS='\t' 'NR <= 7 { print; next } $1 == "end" { print "end", $2 + n; next } { print }
  $1 ~ /\.kvb?f16\./ { if (sub(/\.kvf16\./, ".kvq8_0.", $1)) d = 6; else if (sub(/\.kvbf16\./, ".kvq4_0.", $1)) d = 7
    $3 = substr($3, 1, length($3) - 3) d substr($3, length($3) - 1); print; n++ }' \
  "$tmp/t.tsv" >"$tmp/blocks.tsv"
check "blocks: the table holds q8_0 and q4_0 rows" test "$(grep -cE $'\tkvq[84]_0|\.kvq[84]_0\.' "$tmp/blocks.tsv")" -ge 3
compare_table blocks "$tmp/blocks.tsv"
# AVX2's int16 plane of q (the planes digit 2 on isa 1: vpmaddwd) through the
# header: the int8 row alone, its key at group tile 4 on avx2 with 2 planes,
# header against the JIT (and the double reference).
if grep -qw avx2 /proc/cpuinfo; then
  ikey=$(awk -F'\t' '$9 == "tiny-mask" { print $3; exit }' "$tmp/t.tsv")
  ifields=$($F key decode "$ikey" | awk 'NF == 2 && $1 != "group_tile" && $1 != "isa" && $1 != "planes" { printf "%s=%s ", $1, $2 }')
  mkey=$($F key encode $ifields group_tile=4 isa=avx2 planes=2)
  awk -F'\t' -v OFS='\t' -v k="$mkey" 'NR <= 7 { print; next } $1 == "end" { print "end", 1; next }
    $9 == "tiny-mask" { $3 = k; print }' "$tmp/t.tsv" >"$tmp/msd16.tsv"
  check "msd16: the int8 row's key takes one int16 plane ($mkey)" \
    bash -c "$F key decode '$mkey' | grep -q 'MSD scores in one int16 plane'"
  compare_table msd16 "$tmp/msd16.tsv"
fi
# Feature rows beside the plain ones (signature tokens, gen/facts.lua SIGNATURE):
# each causal row again with a window of its bucket and softcap, and with ALiBi
# and sink logits (3 splits); every row's shape must find its own row in the
# header (fdt_lookup, not the plain row of the same bucket) and in the planner
# (fd_plan_info_get: the window's bucket), with the header's outputs the JIT's.
awk -F'\t' -v OFS='\t' 'NR <= 7 || $1 == "model" { print; next } $1 == "end" { print "end", $2 + n; next } { print }
  $1 ~ /\.causal\./ { s = $1; $4 = 3; $1 = s ".w" $2 ".softcap"; print; $1 = s ".alibi.sink_logits"; print; n += 2 }' \
  "$tmp/t.tsv" >"$tmp/feat.tsv"
check "features: the table holds window, softcap and ALiBi rows" test "$(grep -cE '\.w[0-9]+\.softcap'$'\t''|\.alibi\.sink_logits'$'\t' "$tmp/feat.tsv")" -ge 6
compare_table features "$tmp/feat.tsv"
# The same rows forced to 3 and 5 splits (the header's split and merge path).
awk -F'\t' -v OFS='\t' 'NR > 7 && $1 != "end" && $1 != "model" { $4 = NR % 2 ? 3 : 5 } { print }' "$tmp/t.tsv" >"$tmp/split.tsv"
compare_table split "$tmp/split.tsv"
# One executor: the tiny rows' keys on batches of 5 (rows of buckets 1024 and
# 4096, split 5 and 16 ways) through the header and through exec.c: the same
# work items, item by item, and the same outputs bit for bit (uneven lengths).
# Each row has its variants' rows beside it (softcap, sink logits; causal:
# ALiBi and the window of 3/4 of the bucket test_export.c runs; per-channel K,
# beams and both), the same key and splits: their signatures have tokens of
# their own.
awk -F'\t' -v OFS='\t' 'NR <= 7 { print; next } $1 == "end" { print "end", n; next } $1 == "model" { next }
  function rows(s, b, sp) {
    split(".softcap .sink_logits .k_per_channel .beams .k_per_channel.beams" (s ~ /\.causal\./ ? " .alibi .w" (b - b / 4) : ""), tok, " ")
    print s, b, $3, sp, $5, $6, $7, $8, $9, $10; n++
    for (i = 1; i in tok; i++) { print s tok[i], b, $3, sp, $5, $6, $7, $8, $9, $10; n++ } }
  !seen[$1]++ { s = $1; sub(/^b[0-9]+/, "b5", s); rows(s, 1024, 5); rows(s, 4096, 16) }' \
  "$tmp/t.tsv" >"$tmp/uneven.tsv"
# Exported with the kernels of the feature digits: beams, per-channel K (the
# int8 row) and both, against exec.c too.
check "uneven: export (with --features k_per_channel,beams)" \
  $F export "$tmp/uneven.tsv" -o "$tmp/uneven.h" --features k_per_channel,beams
check "export --features refuses an unknown name" has "$($F export "$tmp/uneven.tsv" -o "$tmp/x.h" --features foo 2>&1)" \
  "'foo' is not a feature digit"
check "uneven: the program with the library's internals builds" gcc -std=c11 -O2 -Wall -Wextra -Werror \
  -D_GNU_SOURCE -DFDT_JIT -DFDT_INTERNAL -DFDT_HEADER="\"$tmp/uneven.h\"" -Iruntime -Itools/fdgen tests/test_export.c tools/fdgen/ref.c \
  "$B/libfd_internal.a" -ltcc -llua5.4 -ldl -lpthread -lm -o "$tmp/uneven.int"
check "uneven: header and exec.c give the same work items and bit-identical outputs (B=5, lengths 1..4096, mirrored)" \
  "$tmp/uneven.int" --uneven "$tmp/uneven.tsv"
check "uneven: the feature variants ran (beams, per-channel K, both)" \
  bash -c "$tmp/uneven.int --uneven $tmp/uneven.tsv | grep -c 'per-channel K + beams\$' | grep -qv '^0\$'"
check "uneven: fdt_run refuses what fd_plan_create + fd_run refuse, with the feature kernels carried" \
  "$tmp/uneven.int" --refusals

# --- 5. the exhaustive sweep (tuner/sweep.lua) on one tiny row ----------------
cat > "$tmp/sweep.lua" <<'LUA'
return {
  { name = "tiny-gqa", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, q_dtype = "f32",
    kv_dtype = "f16", out_dtype = "f32", kv_len = { 200 } },
}
LUA
# Sweep the tiny row into $tmp/$1.{md,log}.
sweep() { local n=$1; shift; env SWEEP_REPORT="$tmp/$n.md" SWEEP_TABLE="$tmp/t.tsv" SWEEP_ROUNDS=12 SWEEP_TOP=2 "$@" \
  "$LUAJIT" tuner/sweep.lua "$tmp/sweep.lua"; }
out=$(sweep s 2>&1)
check "sweep exits 0 and prints its runtime" has "$out" "sweep took"
check "sweep report has the columns" grep -qF '| row | len | configs swept | exhaustive best c/t/s/p/isa | tuned pick | heuristic | tuned/best, held out [95% CI] | tuned/best, all rounds | tuned/heuristic [95% CI] | within 3% | not slower than heuristic |' "$tmp/s.md"
check "sweep report has the row, its ratios and intervals" \
  grep -qE '^\| tiny-gqa \| 200 \| [0-9]+ \(.*\| [0-9.]+ \[[0-9.]+\.\.[0-9.]+\] \| [0-9.]+ \| [0-9.]+ \[[0-9.]+\.\.[0-9.]+\] \| (yes|no) \| (yes|no) \|$' "$tmp/s.md"
check "sweep report has the totals" grep -q "of the exhaustive best on [01] of 1 rows" "$tmp/s.md"
check "sweep used the tuned table's pick" bash -c "! grep -q 'no table pick' $tmp/s.md"
swept=$(grep -oE '^\| tiny-gqa \| 200 \| [0-9]+' "$tmp/s.md" | grep -oE '[0-9]+$')
check "sweep timed every kernel x decomposition that survived (>= 20 configs)" test "${swept:-0}" -ge 20
check "sweep logged pruned kernels with why" grep -q $'^#pruned\t.*\tchunk 512 >= 2 x the length 200' "$tmp/s.log"
# every config of the rounds (the top 2 of the quick pass, the tuned pick and
# the heuristic: 2 to 4, as the picks may coincide with the top 2) reached round 12
rounds_cfgs=$(awk -F'\t' '$6 == "s1" { print $7 }' "$tmp/s.log" | sort -u | wc -l)
check "sweep logged its paired rounds: every config of round 1 in round 12 (got $rounds_cfgs configs)" \
  test "$rounds_cfgs" -ge 2 -a "$(awk -F'\t' '$6 == "s12" { print $7 }' "$tmp/s.log" | sort -u | wc -l)" -eq "$rounds_cfgs"
n=$(measurements "$tmp/s.log")
out=$(sweep s 2>&1)
check "a second sweep measures nothing" has "$out" "(0 measurements, $n reused)"
sweep s2 FD_TUNE_STOP_AFTER=7 >"$tmp/s2.out" 2>&1
check "a sweep stopped by FD_TUNE_STOP_AFTER exits 3" test $? -eq 3
out=$(sweep s2 2>&1)
check "the restarted sweep reuses the 7" has "$out" " 7 reused)"
check "  ... and writes the report" test -s "$tmp/s2.md"
out=$(sweep s3 SWEEP_TABLE="$tmp/none.tsv" 2>&1)
check "a missing tuned table: the heuristic stands in, said" has "$out" "none.tsv is missing"
check "  ... in the report too" grep -q "no table pick" "$tmp/s3.md"

# --- 6. this machine's table from `make tune` -------------------------------
mt=results/tuned/$($F machine).tsv
if [ -f "$mt" ] && $LUAJIT tuner/tuned.lua check "$mt" >/dev/null 2>&1; then
  check "machine table: tuned rows no slower than the heuristic by 3% (final verification)" \
    awk -F'\t' 'NR > 7 && $1 != "end" && $1 != "model" && $6 > 1.03 * $8 { print; bad = 1 } END { exit bad }' "$mt"
  compare_table machine "$mt"
else
  echo "note: $mt missing or from another build (run make tune): its checks skipped"
fi

finish
