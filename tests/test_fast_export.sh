#!/usr/bin/env bash
# Fast precision through the exported header: one-row tables whose keys have
# precision digit 1 (bf16 V, isa 3; group tiles 4 and 16) exported by fdgen
# export, compiled by gcc and tcc with tests/fast_export.c, run against its
# double reference. Needs
# AVX512-BF16 (isa digit 3) to run the kernels; without it only the export is checked.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a one-row table for HQ query heads (2 kv heads) holding key
table() {
  printf 'flashdecode tuned table 2\nlibrary\t0.1.0\ntemplates\t0\ntcc\t0\ncpu\ttest\n'
  printf 'features\tavx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n'
  printf 'columns\tshape\tbucket\tkey\tsplits\tthreads\tmedian_us\tgbps\theuristic_us\tname\tratio_ci\n'
  printf 'b3.hq%d.hkv2.d128.qbf16.kvbf16.of32.causal.bhsd\t1024\t%s\t3\t1\t1\t1\t1\tfast\t-\n' "$1" "$2"
  printf 'end\t1\n'
}
pass=0; fail=0
# tile 4 (row-major weights) and the head-lane tile 16 (weights in key pairs)
for row in "8 100010064128043000220" "32 100010064128163000220"; do
  set -- $row
  table "$1" "$2" >"$tmp/fast$1.tsv"
  if "$B/fdgen" export "$tmp/fast$1.tsv" -o "$tmp/fast$1.h" >"$tmp/log" 2>&1 && grep -q "fast precision (bf16 weights)" "$tmp/fast$1.h"; then
    pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - fdgen export of a precision-1 row ($2)"; cat "$tmp/log"; fi
  if ! grep -q avx512_bf16 /proc/cpuinfo; then continue; fi
  for cc in gcc tcc; do
    if $cc -std=c11 -O2 -DHQ="$1" -DFDT_HEADER="\"$tmp/fast$1.h\"" tests/fast_export.c -lm -o "$tmp/fast.$cc" 2>"$tmp/cc.log" \
       && "$tmp/fast.$cc"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - $cc: the header's fast kernels ($2)"; tail -5 "$tmp/cc.log"; fi
  done
done
grep -q avx512_bf16 /proc/cpuinfo || echo "skipped running the headers' kernels: this CPU has no AVX512-BF16"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
