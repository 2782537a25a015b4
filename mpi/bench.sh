#!/usr/bin/env bash
# fdmpi-bench at np 1, 2 and 4 (oversubscribed where the machine has fewer cores)
# for each shape, written to results/mpi/<machine>.md with the commands that made it.
# Usage: B=build bash mpi/bench.sh ["SHAPE [fdmpi-bench options]" ...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=("llama3-8b --kv-len 65536 --reps 30" "falcon-40b --reps 30" "mqa-b16-d128 --reps 30")
machine=$("$B/fdmpi-bench" --machine)
mkdir -p results/mpi
out=results/mpi/$machine.md
{
  echo "# fdmpi-bench: $machine"
  echo
  echo "- Made by \`B=$B bash mpi/bench.sh${*:+ $*}\`, commit \`$(git rev-parse --short HEAD 2>/dev/null || echo none)\` (plus the"
  echo "  working tree), $(date -u '+%Y-%m-%d %H:%M UTC'); $(mpirun --version | head -n 1)"
  echo "- $(nproc) online cores: np 4 runs 2 ranks per core (\`--oversubscribe\`), so its attention times"
  echo "  include time-sharing, and every rank shares one memory system (no network: MPI moves the states"
  echo "  through shared memory)"
  echo "- Load average at start: \`$(cat /proc/loadavg)\`"
  echo
  for run in "${runs[@]}"; do
    for n in 1 2 4; do
      echo "\`mpirun --oversubscribe --allow-run-as-root -np $n $B/fdmpi-bench $run\`"
      echo
      # shellcheck disable=SC2086
      mpirun --oversubscribe --allow-run-as-root -np "$n" "$B/fdmpi-bench" $run
    done
  done
  echo "Load average at end: \`$(cat /proc/loadavg)\`"
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
