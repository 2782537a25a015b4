#!/usr/bin/env bash
# The C command line: generator subcommands through the embedded Lua, `run`
# against the reference, `bench` rows, and refusals.
set -u
B=${B:-build}
F=$B/fdgen
pass=0; fail=0
# Record one check: name, then a command that must succeed.
check() {
  local name=$1; shift
  if "$@" >/dev/null 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - $name"; fi
}
has() { grep -q -- "$2" <<<"$1"; }
tmp=$(mktemp -d)

out=$($F key encode head_dim=128 chunk=256 group_tile=4 q_dtype=bf16 kv_dtype=bf16 out_dtype=bf16)
check "key encode" test "$out" = 10256128040002220
out=$($F key decode 10256128040002220)
check "key decode" has "$out" "group tile 4"
check "key decode refuses a bad key" bash -c "! $F key decode 10256128040002250"
out=$(cd /tmp && "$OLDPWD/$F" source 10032064020000100)
check "source works outside the tree (embedded templates)" has "$out" "fd_k10032064020000100_desc"
check "gen writes variants and an index" bash -c "$F gen tuner/shapes/default.lua -o $tmp/gen && test -s $tmp/gen/index.tsv"
out=$($F run --shape llama3-8b-tp8 --kv-len 300 --splits 3)
check "run prints keys" has "$out" "split key  1"
check "run checks against the reference" has "$out" ": ok"
out=$($F run --shape "batch=2,n_q_heads=8,n_kv_heads=2,head_dim=80,kv_dtype=fp8,mask_mode=full,layout=bshd,kv_len=99" --chunk 32 --tile 2 --threads 1)
check "run with an inline shape, fp8 BSHD" has "$out" ": ok"
out=$($F run --shape nosuch 2>&1)
check "run refuses an unknown shape" has "$out" "no shape called nosuch"
out=$($F run --shape llama3-8b --tile 3 2>&1)
check "run reports a planner refusal" has "$out" "opts.group_tile 3"
cat > "$tmp/s.lua" <<'LUA'
return { { name = "t", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, kv_len = { 64, 128 } } }
LUA
out=$($F bench "$tmp/s.lua" --reps 3)
check "bench prints one row per length" test "$(grep -c '^| t |' <<<"$out")" -eq 2
check "machine name" bash -c "$F machine | grep -q -- '-[0-9]*c$'"
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
