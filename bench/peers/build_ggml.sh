#!/usr/bin/env bash
# ggml for `make bench-peers`: download the llama-cpp-python source distribution
# (pinned VERSION) from PyPI with pip, unpack vendor/llama.cpp/ggml, build its CPU
# backend natively with cmake (shared libraries, no BLAS, no OpenMP: ggml's own
# threadpool) and install it under DIR/ggml-VERSION. Done once; later runs reuse it.
#   usage: build_ggml.sh DIR VERSION
# Never fails the make: it always writes
#   DIR/ggml.status  "status<TAB>ok" with the versions and build flags, or
#                    "status<TAB>unavailable" and "why<TAB>..." (no pip, no network, ...)
#   DIR/ggml.flags   the harness's extra compile and link flags (empty when unavailable),
#                    rewritten only when they change, so make rebuilds the harness then.
# Nothing of ggml is ever copied into the repository: DIR is a build folder.
set -u
[ $# -eq 2 ] || { echo "usage: build_ggml.sh DIR VERSION" >&2; exit 2; }
mkdir -p "$1" || exit 2
DIR=$(cd "$1" && pwd)
VER=$2
PREFIX=$DIR/ggml-$VER
SRC=$DIR/src-$VER
SDIST=$DIR/dl/llama_cpp_python-$VER.tar.gz
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_CPU=ON -DGGML_OPENMP=OFF \
-DGGML_BLAS=OFF -DGGML_BACKEND_DL=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF"

# Replace DIR/ggml.flags with $1 unless it already holds exactly that.
write_flags() {
  if [ ! -f "$DIR/ggml.flags" ] || [ "$(cat "$DIR/ggml.flags")" != "$1" ]; then
    printf '%s\n' "$1" > "$DIR/ggml.flags"
  fi
}

# Record that the peer cannot be used, and why; exit 0 so the benchmark goes on.
unavailable() {
  printf 'status\tunavailable\nwhy\t%s\n' "$1" > "$DIR/ggml.status"
  write_flags ""
  echo "bench-peers: peer unavailable: $1" >&2
  exit 0
}

# The last non-empty line of a log, for a one-line reason.
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-300; }

# The first pip that runs: python3 -m pip, pip3, pip.
find_pip() {
  for p in "python3 -m pip" pip3 pip; do
    if $p --version > /dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

# Download the sdist into DIR/dl unless it is there.
fetch() {
  [ -s "$SDIST" ] && return 0
  local pip
  pip=$(find_pip) || unavailable "no pip (tried python3 -m pip, pip3, pip) to download llama-cpp-python==$VER"
  mkdir -p "$DIR/dl"
  echo "bench-peers: $pip download llama-cpp-python==$VER (source distribution, about 75 MB)" >&2
  timeout 600 $pip download --retries 2 --timeout 30 --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$DIR/dl" \
    > "$DIR/pip.log" 2>&1 || unavailable "pip download llama-cpp-python==$VER failed: $(last_line "$DIR/pip.log")"
  [ -s "$SDIST" ] || unavailable "pip download left no $SDIST"
}

# Unpack ggml's source (only vendor/llama.cpp/ggml) into DIR/src-VERSION.
unpack() {
  rm -rf "$SRC" && mkdir -p "$SRC" || unavailable "cannot create $SRC"
  tar xzf "$SDIST" -C "$SRC" --strip-components=4 "llama_cpp_python-$VER/vendor/llama.cpp/ggml" \
    || unavailable "$SDIST has no vendor/llama.cpp/ggml"
  # The sdist omits the pkg-config template a top-level ggml configure writes; an empty one suffices.
  [ -f "$SRC/ggml.pc.in" ] || : > "$SRC/ggml.pc.in"
}

# Configure, build (2 jobs: the machine is shared) and install into DIR/ggml-VERSION.
build() {
  command -v cmake > /dev/null || unavailable "cmake not found (Debian package cmake)"
  echo "bench-peers: building ggml $VER's CPU backend (cmake, about 2 minutes on 2 cores)" >&2
  # GIT_CEILING_DIRECTORIES: ggml's CMakeLists asks git for a commit; keep it from finding this repository's.
  GIT_CEILING_DIRECTORIES=$DIR cmake -S "$SRC" -B "$DIR/cmake-$VER" $CMAKE_FLAGS -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DCMAKE_INSTALL_LIBDIR=lib > "$DIR/cmake.log" 2>&1 || unavailable "cmake configure failed: $(last_line "$DIR/cmake.log")"
  cmake --build "$DIR/cmake-$VER" -j 2 >> "$DIR/cmake.log" 2>&1 \
    || unavailable "ggml build failed: $(last_line "$DIR/cmake.log")"
  cmake --install "$DIR/cmake-$VER" >> "$DIR/cmake.log" 2>&1 || unavailable "cmake --install failed"
  [ -f "$PREFIX/lib/libggml-cpu.so" ] || unavailable "no libggml-cpu.so after the build"
  touch "$PREFIX/.built"
}

# ggml's version from its CMakeLists.txt ("0.25.3").
ggml_version() {
  sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$SRC/CMakeLists.txt" 2>/dev/null | paste -sd.
}

if [ ! -f "$PREFIX/.built" ]; then
  fetch
  unpack
  build
fi
{
  printf 'status\tok\n'
  printf 'llama_cpp_python\t%s\n' "$VER"
  printf 'ggml\t%s\n' "$(ggml_version)"
  printf 'flags\t%s\n' "$(echo "$CMAKE_FLAGS" | tr -s ' ')"
  printf 'compiler\t%s\n' "$(cc --version 2>/dev/null | head -n 1)"
  printf 'prefix\t%s\n' "$PREFIX"
} > "$DIR/ggml.status"
write_flags "-DFDP_GGML -I$PREFIX/include -L$PREFIX/lib -lggml -lggml-base -lggml-cpu -Wl,-rpath,$PREFIX/lib"
echo "bench-peers: ggml $(ggml_version) from llama-cpp-python $VER in $PREFIX" >&2
