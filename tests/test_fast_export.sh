#!/usr/bin/env bash
# Fast precision through the exported header: a one-row table whose key has
# precision digit 1 (bf16 V, isa 3) exported by fdgen export, compiled by gcc
# with tests/fast_export.c, run against its double reference. Needs
# AVX512-BF16 (isa digit 3) to run the kernels; without it only the export is checked.
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  printf 'flashdecode tuned table 2\nlibrary\t0.1.0\ntemplates\t0\ntcc\t0\ncpu\ttest\n'
  printf 'features\tavx512f avx512bw avx512vl avx512_bf16 avx512_vnni\n'
  printf 'columns\tshape\tbucket\tkey\tsplits\tthreads\tmedian_us\tgbps\theuristic_us\tname\tratio_ci\n'
  printf 'b3.hq8.hkv2.d128.qbf16.kvbf16.of32.causal.bhsd\t1024\t100010064128043000220\t3\t1\t1\t1\t1\tfast\t-\n'
  printf 'end\t1\n'
} >"$tmp/fast.tsv"
pass=0; fail=0
if "$B/fdgen" export "$tmp/fast.tsv" -o "$tmp/fast.h" >"$tmp/log" 2>&1 && grep -q "fast precision (bf16 weights)" "$tmp/fast.h"; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - fdgen export of a precision-1 row"; cat "$tmp/log"; fi
if ! grep -q avx512_bf16 /proc/cpuinfo; then
  echo "skipped running the header's kernels: this CPU has no AVX512-BF16"; echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
for cc in gcc tcc; do
  if $cc -std=c11 -O2 -DFDT_HEADER="\"$tmp/fast.h\"" tests/fast_export.c -lm -o "$tmp/fast.$cc" 2>"$tmp/cc.log" \
     && "$tmp/fast.$cc"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - $cc: the header's fast kernels"; tail -5 "$tmp/cc.log"; fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
