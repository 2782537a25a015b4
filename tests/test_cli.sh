#!/usr/bin/env bash
# The C command line: generator subcommands through the embedded Lua, `run`
# against the reference, `bench` rows, and refusals; the help of every
# subcommand (exit 0, stdout) and usage errors (exit 2, usage on stderr, stdout
# empty), for build/fdgen and for gen/fdgen.lua run directly.
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
# Run a command: its exit status, stdout and stderr land in rc, out and err.
call() { out=$("$@" 2>"$tmp/err"); rc=$?; err=$(<"$tmp/err"); }
# The command (after name and needle) prints help: exit 0, needle on stdout, stderr empty.
help_ok() {
  local name=$1 needle=$2; shift 2
  call "$@"
  check "$name: exit 0 (got $rc), '$needle' on stdout, nothing on stderr" \
    eval '[ "$rc" -eq 0 ] && [ -z "$err" ] && has "$out" "$needle"'
}
# The command is a usage error: exit 2, stdout empty, needle and a usage on stderr.
usage_err() {
  local name=$1 needle=$2; shift 2
  call "$@"
  check "$name: exit 2 (got $rc), stdout empty, '$needle' and a usage on stderr" \
    eval '[ "$rc" -eq 2 ] && [ -z "$out" ] && has "$err" "$needle" && has "$err" "^usage: fdgen"'
}
# $out lists every command of $1 with a summary, and an example.
lists_all() {
  for s in $1; do has "$out" "^  $s  *[a-z(]" || return 1; done
  has "$out" "^example:"
}
SUBS="key source gen export run bench machine help"

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
out=$($F run --shape "batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,q_dtype=bf16,kv_dtype=e5m2,out_dtype=f16,kv_len=300" --splits 3)
check "run with an inline shape, fp8 e5m2" has "$out" ": ok"
# FD_CC_DEBUG: a cc kernel carries debug lines naming the template statements
# (#line, -g) and still matches the reference; without it, no debug lines.
shape="batch=1,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtype=bf16,kv_len=300"
out=$(FD_CC_DEBUG=1 FD_CACHE_DIR="$tmp/ccdbg" $F run --shape "$shape" --backend cc --splits 2)
check "run --backend cc under FD_CC_DEBUG=1 checks against the reference" has "$out" ": ok"
check "FD_CC_DEBUG=1: the cc kernel's debug lines name decode.c.tpl@LINE" \
  bash -c "readelf --debug-dump=decodedline $tmp/ccdbg/fd_k*.so | grep -q 'decode.c.tpl@[0-9]'"
out=$(FD_CC_DEBUG=0 FD_CACHE_DIR="$tmp/ccnodbg" $F run --shape "$shape" --backend cc --splits 2)
check "run --backend cc with FD_CC_DEBUG=0 checks against the reference" has "$out" ": ok"
check "FD_CC_DEBUG=0: the cc kernel has no debug lines" \
  bash -c "ls $tmp/ccnodbg/fd_k*.so >/dev/null && ! readelf -S $tmp/ccnodbg/fd_k*.so | grep -q debug_line"
# a paged shape: its rows in shuffled pages (int8: their scales paged too), a
# pool with spare pages, and a pool too small for the rows, named
out=$($F run --shape "batch=3,n_q_heads=16,n_kv_heads=2,head_dim=64,q_dtype=bf16,kv_dtype=bf16,layout=paged,page_size=16,kv_len=777" --splits 2)
check "run with a paged inline shape checks against the reference" has "$out" ": ok"
out=$($F run --shape "batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtype=i8,layout=paged,page_size=64,pool_pages=40,kv_len=300" --tile 4)
check "run with a paged int8 shape and spare pool pages" has "$out" ": ok"
call $F run --shape "batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,layout=paged,page_size=64,pool_pages=9,kv_len=300"
check "run refuses a pool smaller than the rows' pages" bash -c "[ $rc = 2 ] && grep -q 'shape.pool_pages 9 holds fewer pages than the 10' <<<\"\$1\"" _ "$err"
out=$($F run --shape nosuch 2>&1)
check "run refuses an unknown shape" has "$out" "no shape called nosuch"
out=$($F run --shape llama3-8b --tile 3 2>&1)
check "run reports a planner refusal" has "$out" "opts.group_tile 3"
cat > "$tmp/s.lua" <<'LUA'
return { { name = "t", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, kv_len = { 64, 128 } } }
LUA
out=$($F bench "$tmp/s.lua" --reps 3)
check "bench prints one row per length" test "$(grep -c '^| t |' <<<"$out")" -eq 2
check "machine name ends in the cores and the best isa's name" bash -c "$F machine | grep -qE -- '-[0-9]+c-[a-z][a-z0-9]*$'"

# Help: the list of commands, and each command's usage, options and example.
for h in --help -h help; do
  help_ok "fdgen $h" "^usage: fdgen COMMAND" $F $h
  check "fdgen $h lists every command with a summary" lists_all "$SUBS"
done
for s in $SUBS; do
  for h in --help -h; do help_ok "fdgen $s $h" "^usage: fdgen $s" $F $s $h; done
  help_ok "fdgen help $s" "^usage: fdgen $s" $F help $s
  check "fdgen help $s has options and an example" eval 'has "$out" "^  -h, --help" && has "$out" "^example:"'
  usage_err "fdgen $s with an unknown option" "unknown option '--no-such-option'" $F $s --no-such-option
done
help_ok "fdgen run --help lists its options" "^  --kv-len N" $F run --help
help_ok "fdgen key --help lists the key fields" "^  head_dim" $F key --help

# Usage errors: unknown commands, missing arguments, bad values.
usage_err "fdgen with no command" "no command given" $F
usage_err "an unknown command" "unknown command 'frobnicate'" $F frobnicate
usage_err "help on an unknown command" "unknown command 'frobnicate'" $F help frobnicate
usage_err "run without --shape" "option --shape NAME|SPEC is required" $F run --kv-len 64
usage_err "run with an option missing its value" "option --kv-len needs a value" $F run --shape llama3-8b --kv-len
usage_err "run --kv-len not an integer" "--kv-len '12x' is not an integer" $F run --shape llama3-8b --kv-len 12x
usage_err "run --backend not tcc or cc" "--backend 'gcc' is not tcc or cc" $F run --shape llama3-8b --backend gcc
usage_err "bench --reps out of range" "--reps '99' is not an integer in 1..32" $F bench --reps 99
usage_err "bench with two shape sets" "unexpected argument 'b.lua'" $F bench a.lua b.lua
usage_err "machine with an argument" "unexpected argument 'x'" $F machine x
usage_err "key without an action" "key: missing argument" $F key
usage_err "key with an unknown action" "unknown key action 'frob'" $F key frob
usage_err "key decode without KEY" "key decode takes one KEY" $F key decode
usage_err "source without KEY" "source: missing argument" $F source
usage_err "gen without -o" "option -o DIR is required" $F gen tuner/shapes/default.lua
usage_err "export without -o" "option -o HEADER is required" $F export "$tmp/t.tsv"
usage_err "export -o missing its value" "option -o needs a value" $F export "$tmp/t.tsv" -o

# gen/fdgen.lua run directly answers the same way (its own commands only).
for lua in lua5.4 luajit; do
  help_ok "$lua gen/fdgen.lua --help" "^usage: fdgen COMMAND" $lua gen/fdgen.lua --help
  check "$lua gen/fdgen.lua --help lists its commands" lists_all "key source gen export help"
  help_ok "$lua gen/fdgen.lua help gen" "^usage: fdgen gen SHAPES.lua -o DIR" $lua gen/fdgen.lua help gen
  help_ok "$lua gen/fdgen.lua export -h" "^  --default KEY" $lua gen/fdgen.lua export -h
  usage_err "$lua gen/fdgen.lua with an unknown command" "unknown command 'run'" $lua gen/fdgen.lua run
  usage_err "$lua gen/fdgen.lua gen with an unknown option" "unknown option '-x'" $lua gen/fdgen.lua gen a.lua -x 1
done
rm -rf "$tmp"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
