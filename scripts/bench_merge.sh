#!/usr/bin/env bash
# Merge strategy measurement: the last worker of a (batch, kv head) merges it
# (default) vs a second parallel pass (FD_MERGE=pass). fd_run medians from
# `fdgen bench`, the two modes alternating, several rounds; writes a report.
set -eu
cd "$(dirname "$0")/.."
out=results/runtime/merge-$(build/fdgen machine).md
shapes=$(mktemp --suffix=.lua)
cat > "$shapes" <<'LUA'
return {
  { name = "tp8-1k", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 128, kv_dtype = "f16", kv_len = { 1024 } },
  { name = "mqa-b8-2k", batch = 8, n_q_heads = 8, n_kv_heads = 1, head_dim = 128, kv_dtype = "f16", kv_len = { 2048 } },
}
LUA
{
  echo "# Merge strategy: last worker vs second pass"
  echo
  echo "\`scripts/bench_merge.sh\` on $(build/fdgen machine), commit $(git rev-parse --short HEAD), $(date -u +%F)."
  echo "fd_run median of 21 runs (warm cache) per cell; modes alternate, 3 rounds."
  echo
  echo "| splits | round | mode | tp8-1k ms | mqa-b8-2k ms |"
  echo "|---|---|---|---|---|"
  for splits in 8 64; do
    for round in 1 2 3; do
      for mode in last pass; do
        if [ "$mode" = pass ]; then export FD_MERGE=pass; else unset FD_MERGE; fi
        row=$(build/fdgen bench "$shapes" --splits "$splits" --reps 21 | awk -F'|' '/^\| (tp8|mqa)/ {printf "%s |", $9}')
        echo "| $splits | $round | $mode |$row"
      done
    done
  done
} > "$out"
rm -f "$shapes"
cat "$out"
