#!/usr/bin/env bash
# Install the Debian packages the build, the tests and the tuner need, only those missing.
# `deps.sh --list` prints the packages the project brings (those a bare Debian
# machine of this kind lacks), for CI to purge before it proves the README.
set -euo pipefail
project=(lua5.4 liblua5.4-dev luajit libluajit-5.1-dev tcc libtcc-dev gnuplot-nox python3-numpy openmpi-bin libopenmpi-dev)
base=(gcc make binutils pkg-config python3 clang libclang-rt-14-dev linux-perf)
if [ "${1:-}" = "--list" ]; then echo "${project[*]}"; exit 0; fi
need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${project[@]}" "${base[@]}"; do
  have_pkg "$p" || need+=("$p")
done
[ ${#need[@]} -eq 0 ] && exit 0
echo "deps: installing ${need[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${need[@]}" >/dev/null
