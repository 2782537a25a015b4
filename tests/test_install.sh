#!/usr/bin/env bash
# The library as a user installs it: no liblua/libtcc dependency, only the
# public API exported, a SONAME; `make install DESTDIR PREFIX=/usr`, then C
# (pkg-config flags only, shared and static), LuaJIT and Python programs from
# outside the source tree against the installed tree; `make uninstall` leaves
# no file behind.
set -u
B=${B:-build}
root=$(pwd)
pass=0; fail=0
# Record one check: name, then a command that must succeed (its output shown on failure).
check() {
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL - $name"; echo "$out" | tail -n 5; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
so=$B/libflashdecode.so

# The functions flashdecode.h declares, one per line, sorted.
header_api() {
  sed -n 's/^[a-z_0-9 ]*[ *]\(fd_[a-z_0-9]*\)(.*/\1/p' runtime/flashdecode.h | sort -u
}
check "ldd: no liblua, no libtcc" bash -c "! ldd $so | grep -E 'liblua|libtcc'"
check "exported symbols are exactly the functions of flashdecode.h" \
  diff <(nm -D --defined-only "$so" | awk '{ print $3 }' | sort -u) <(header_api)
check "SONAME libflashdecode.so.0" bash -c "readelf -d $so | grep -q 'SONAME.*libflashdecode.so.0'"
check "static library exports only the public API" \
  diff <(nm -g --defined-only "$B/libflashdecode.a" | awk 'NF == 3 { print $3 }' | sort -u) <(header_api)

dest=$tmp/dest
check "make install DESTDIR PREFIX=/usr" make -s B="$B" install DESTDIR="$dest" PREFIX=/usr
usr=$dest/usr
export PKG_CONFIG_PATH=$usr/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
cd "$tmp"
check "pkg-config knows flashdecode" pkg-config --exists flashdecode
check "C program built with pkg-config flags only, shared" \
  bash -c "cc -O2 $root/examples/c_decode.c \$(pkg-config --cflags --libs flashdecode) -lm -o c_shared"
check "shared build runs and matches the reference" env LD_LIBRARY_PATH="$usr/lib" ./c_shared
check "C program linked statically against libflashdecode.a" \
  bash -c "cc -O2 $root/examples/c_decode.c \$(pkg-config --cflags flashdecode) $usr/lib/libflashdecode.a \$(pkg-config --static --libs-only-l flashdecode | sed 's/-lflashdecode//') -lm -o c_static"
check "static build runs and matches the reference" ./c_static
check "examples/cascade.c (shared prefix + suffixes + fd_merge_states) builds with pkg-config flags only" \
  bash -c "cc -O2 $root/examples/cascade.c \$(pkg-config --cflags --libs flashdecode) -lm -o cascade"
check "cascade attention matches attention over the concatenation" env LD_LIBRARY_PATH="$usr/lib" ./cascade
check "installed fdgen runs from outside the tree" bash -c "LD_LIBRARY_PATH=$usr/lib $usr/bin/fdgen key decode 10256128040002220 | grep -q 'group tile 4'"
if [ -f "$root/lua/flashdecode.lua" ]; then
  check "LuaJIT: require 'flashdecode' from the installed tree" \
    env LUA_PATH="$usr/share/lua/5.1/?.lua;;" LD_LIBRARY_PATH="$usr/lib" FD_INCLUDE_DIR="$usr/include" \
    luajit "$root/examples/luajit_decode.lua"
fi
if [ -d "$root/python/flashdecode" ]; then
  check "Python: import flashdecode from the installed tree" \
    env PYTHONPATH="$usr/lib/python3/dist-packages" LD_LIBRARY_PATH="$usr/lib" \
    /usr/bin/python3 "$root/examples/python_decode.py"
fi
cd "$root"
check "make uninstall" make -s B="$B" uninstall DESTDIR="$dest" PREFIX=/usr
left=$(find "$dest" -type f -o -type l)
check "nothing left after uninstall${left:+: $left}" test -z "$left"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
