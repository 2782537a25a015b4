#!/usr/bin/env bash
# The recipe for a per-key boolean feature (docs/DESIGN.md, "How to add a
# per-key feature"), followed for a dummy feature in a scratch copy of the
# tree: the edits of tests/recipe_dummy.py touch the files the recipe lists
# (at most 6), and the feature then reaches every consumer without another
# edit: the key (fdgen key encode/decode), the generator (the template sees
# DUMMY), the planner (a shape with dummy = 1 plans and runs a key with digit
# 21 set), the bindings (LuaJIT and Python shapes take the field), the tuner
# (its table row), and the exporter (the header's rows, fit check and kernel).
set -u
cd "$(dirname "$0")/.."
LUAJIT=${LUAJIT:-luajit}
. tests/check.sh

# The scratch tree: the files git knows (tracked and new), as a repository of its own.
src=$tmp/src
mkdir -p "$src"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$src"
(cd "$src" && git init -q && git add -A && git -c user.name=t -c user.email=t commit -qm base)

check "the recipe's edits apply" /usr/bin/python3 tests/recipe_dummy.py "$src"
changed=$(cd "$src" && git status --porcelain | wc -l)
echo "recipe: the dummy feature touched $changed files: $(cd "$src" && git status --porcelain | awk '{ print $2 }' | tr '\n' ' ')"
check "the dummy feature touches at most 6 files (it touched $changed)" test "$changed" -ge 1 -a "$changed" -le 6

check "the scratch tree builds" make -C "$src" -j2 B=build lib build/fdgen build/libfdbench.so
F=$src/build/fdgen
key=$($F key encode dummy=1 head_dim=64 chunk=64 group_tile=4 2>&1)
check "fdgen key encodes the dummy digit (digit 21: $key)" test "$key" = 1000010064064040000000
out=$($F key decode "$key" 2>&1)
check "fdgen key decodes it" has "$out" "dummy *1"
check "the generator's template sees DUMMY" has "$($F source "$key" 2>&1)" "dummy feature on"
check "a key without it has none of its code" bash -c "! $F source 10064064040000000 | grep -q 'dummy feature on'"

# The planner, through the LuaJIT binding (whose shape fields come from gen/facts.lua).
cat >"$tmp/plan.lua" <<'LUA'
package.path = arg[1] .. "/lua/?.lua;" .. arg[1] .. "/gen/?.lua;" .. package.path
local fd = require("flashdecode")
local ctx = fd.context { threads = 1 }
local plan = ctx:plan { batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, kv_len = 100, dummy = 1 }
local info = plan:info(100)
local n = 100 * 64
local q, k, v, out = fd.array("f32", 4 * 64), fd.array("f32", n), fd.array("f32", n), fd.array("f32", 4 * 64)
plan:run { q = q, k = k, v = v, cur_pos = 99, out = out }
print(info.key)
LUA
out=$(FD_LIB=$src/build/libflashdecode.so $LUAJIT "$tmp/plan.lua" "$src" 2>&1)
check "the planner puts the shape's dummy = 1 into its key and runs it ($out)" has "$out" "^100001"
out=$(cd "$src" && FD_LIB=build/libflashdecode.so PYTHONPATH=python /usr/bin/python3 -c \
  "import flashdecode as fd; c = fd.Context(threads=1); p = c.plan(1, 4, 1, 64, 100, dummy=1); print(p.info()['key'])" 2>&1)
check "the Python binding takes the field and plans its key ($out)" has "$out" "^100001"

# The tuner and the exporter: a tiny shape with dummy = 1, tuned, exported, compiled.
cat >"$tmp/shapes.lua" <<'LUA'
return { { name = "dummy", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, q_dtype = "f32",
           kv_dtype = "f32", out_dtype = "f32", dummy = 1, kv_len = { 128 } } }
LUA
out=$(cd "$src" && TUNE_PROGRESS=0 FD_LIB=build/libflashdecode.so FDGEN=build/fdgen TUNE_TABLE="$tmp/t.tsv" \
  TUNE_BUDGET=2 $LUAJIT tuner/tune.lua "$tmp/shapes.lua" 2>&1)
check "the tuner tunes it ($out)" has "$out" "(written)"
check "its table row has the field in the shape and the key" grep -Eq $'\\.x1\t128\t100001' "$tmp/t.tsv"
check "the exported header carries the dummy kernel" grep -q "dummy feature on" "$tmp/t.h"
cat >"$tmp/use.c" <<'C'
#include HEADER
int main(void) {
  fdt_shape s = { .batch = 1, .n_q_heads = 4, .n_kv_heads = 1, .head_dim = 64, .kv_len = 128, .dummy = 1 };
  const fdt_row *on = fdt_lookup(&s, 128);
  s.dummy = 0;
  return !(on && on->dummy == 1 && on->plain->dummy == 1 && !fdt_lookup(&s, 128));
}
C
check "the header's rows and fit check know the field" \
  bash -c "gcc -std=c11 -O0 -DHEADER='\"$tmp/t.h\"' $tmp/use.c -lm -o $tmp/use && $tmp/use"
finish
