#!/usr/bin/env bash
# Compile every generated variant in DIR with tcc and with gcc -std=c11 -Wall -Wextra -Werror,
# at -O0 and at -O2 (optimizing compilers take the template's loop form, tcc the unrolled one).
set -u
dir=$1
out=$(mktemp -d)
files=$(ls "$dir"/fd_k*.c 2>/dev/null)
[ -n "$files" ] || { echo "FAIL - no variants in $dir"; echo "0 passed, 1 failed"; exit 1; }
# One variant with one compiler: prints "ok" or the compiler's messages.
check() {
  local cc=$1 f=$2 o=$3/$(basename "$2").$1.o
  case $cc in
    tcc) msg=$(tcc -c "$f" -o "$o" 2>&1) ;;
    gcc) msg=$(gcc -std=c11 -Wall -Wextra -Werror -c "$f" -o "$o" 2>&1) ;;
    gcc-O2) msg=$(gcc -std=c11 -Wall -Wextra -Werror -O2 -c "$f" -o "$o" 2>&1) ;;
  esac
  if [ $? -eq 0 ] && [ -z "$msg" ]; then echo "ok"; else echo "FAIL - $cc $(basename "$f"): $msg"; fi
  rm -f "$o"
}
export -f check
res=$( (for f in $files; do echo "tcc $f"; echo "gcc $f"; echo "gcc-O2 $f"; done) | xargs -P "$(nproc)" -n 2 bash -c 'check "$0" "$1" '"$out")
rm -rf "$out"
pass=$(echo "$res" | grep -c '^ok$'); fail=$(echo "$res" | grep -c '^FAIL')
echo "$res" | grep '^FAIL' | head -20
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
