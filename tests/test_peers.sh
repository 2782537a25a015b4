#!/usr/bin/env bash
# `make bench-peers` without ggml: the harness (bench/peers/peers.c) built
# without the peer, and the driver (bench/peers/peers.lua) over one tiny
# shape, QUICK, from another directory. The driver loads its modules (the
# report's roof rule needs gen/facts.lua), runs the harness, checks
# flashdecode against the double reference and writes its report, saying the
# peer is unavailable. Times are written, never asserted.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
LUAJIT=${LUAJIT:-luajit}
. tests/check.sh

kvs=$("$LUAJIT" -e 'for _, s in ipairs(assert(loadfile("bench/peers/shapes.lua"))(".")) do io.write(s.kv_dtype, " ") end')
names=$("$LUAJIT" -e 'for _, s in ipairs(assert(loadfile("bench/peers/shapes.lua"))(".")) do io.write(s.name, "\n") end')
check "  ... each shape once" test -z "$(sort <<<"$names" | uniq -d)"
check "the default peers shapes hold only K/V the harness takes (f32 f16 bf16 int8: $kvs)" \
  bash -c '[ -n "$1" ] && ! grep -qvE "^(f32|f16|bf16|int8)$" <(tr " " "\n" <<<"$1" | sed "/^$/d")' _ "$kvs"
check "the harness builds without ggml (make $B/peers/fdpeers-noggml)" make -s B="$B" "$B/peers/fdpeers-noggml"
cat >"$tmp/shapes.lua" <<'LUA'
return { { name = "tiny", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 64, q_dtype = "f32", kv_dtype = "f16",
           out_dtype = "f32", mask_mode = "causal", layout = "bhsd", kv_len = { 256 }, quick = { 256 } } }
LUA
: >"$tmp/ggml.status"
root=$PWD
out=$(cd "$tmp" && QUICK=1 SHAPES="$tmp/shapes.lua" FDP_HARNESS="$root/$B/peers/fdpeers-noggml" FDP_STATUS="$tmp/ggml.status" \
  FDP_OUT="$tmp/out" FDP_PLOT=0 FDP_PLOT_DIR="$tmp/plot" "$LUAJIT" "$root/bench/peers/peers.lua" 2>&1)
rc=$?
check "the driver exits 0 (its output is shown on failure)" bash -c 'printf "%s\n" "$2"; test "$1" -eq 0' _ "$rc" "$out"
md=$(ls "$tmp"/out/*-quick.md 2>/dev/null | head -n 1)
check "it writes the quick report" test -n "$md"
row=$(grep '^| tiny | 256 |' "$md" 2>/dev/null | head -n 1)
check "the report has a timed flashdecode row for the tiny shape ($row)" \
  bash -c '[[ "$1" =~ ^\|\ tiny\ \|\ 256\ \|\ f16\ \|\ [0-9]+\ \|\ [0-9.]+\ \( ]]' _ "$row"
check "  ... without a peer" grep -qi "peer unavailable" "$md"
finish
