#!/usr/bin/env bash
# llama.cpp, the oracle for real GGUF files: built for the CPU from the PyPI sdist of llama-cpp-python 0.3.36,
# which vendors llama.cpp (commit 0c1e570) under vendor/llama.cpp.  The source and the build are cached outside
# the source tree, keyed by the sdist version (the build also by its targets and flags), so a second run only prints
# the paths.
#
#   tools/llamacpp.sh            download (sha256-checked), unpack, build; prints the bin directory
#   tools/llamacpp.sh --src      the same, but prints the unpacked vendor/llama.cpp directory
#   tools/llamacpp.sh --bin      print the bin directory if the build is there, else fail (builds nothing)
#   tools/llamacpp.sh --src-path print the source directory if it is unpacked, else fail (fetches nothing)
#   tools/llamacpp.sh --oracle   print the path of llama_oracle built from this tree's tools/llama_oracle.cpp if it
#                                is there, else fail (builds nothing)
#
# The full run also builds llama_oracle (tools/llama_oracle.cpp, ours: what the tests ask llama.cpp that its tools
# do not print) against that build's llama.h and shared libllama, rpath to its bin directory. It is cached by the
# hash of its source (<build>/oracle-<hash>/llama_oracle), so a changed source rebuilds it alone, in seconds.
#
#   WGLLM_CACHE   the cache root (default ~/.cache/wgllm); the build lands in $WGLLM_CACHE/llama.cpp-<version>/
set -euo pipefail

VERSION=0.3.36
SDIST=llama_cpp_python-${VERSION}.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TARGETS=(llama-completion llama-perplexity llama-tokenize llama-bench llama-quantize)

CACHE=${WGLLM_CACHE:-$HOME/.cache/wgllm}
DIR=$CACHE/llama.cpp-$VERSION
SRC=$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp
# Native code, but without AMX: ggml's AMX matmul (taken for Q8_0 and other quantised weights on CPUs that have
# AMX) dies with SIGILL where the kernel or a sandbox does not grant a process the AMX tile state.
FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BUILD=$DIR/build-$(echo "${TARGETS[*]} $FLAGS" | sha256sum | cut -c1-12)
BIN=$BUILD/bin
STAMP=$BUILD/.built
ORACLE_SRC=$(cd "$(dirname "$0")" && pwd)/llama_oracle.cpp
ORACLE=$BUILD/oracle-$(sha256sum "$ORACLE_SRC" | cut -c1-12)/llama_oracle

say()  { printf '[llamacpp] %s\n' "$*" >&2; }
fail() { printf '[llamacpp] error: %s\n' "$*" >&2; exit 1; }

mode=${1:-}
case "$mode" in
  ""|--src) ;;
  --bin) [ -f "$STAMP" ] || fail "no llama.cpp build in $DIR (run tools/llamacpp.sh)"; echo "$BIN"; exit 0 ;;
  --src-path) [ -f "$SRC/CMakeLists.txt" ] || fail "no llama.cpp source in $DIR (run tools/llamacpp.sh --src)"
              echo "$SRC"; exit 0 ;;
  --oracle) [ -x "$ORACLE" ] || fail "no llama_oracle built from $ORACLE_SRC (run tools/llamacpp.sh)"
            echo "$ORACLE"; exit 0 ;;
  *) fail "unknown option '$mode' (use --src, --bin, --src-path or --oracle)" ;;
esac

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9  # one build at a time per cache

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  if [ ! -f "$DIR/$SDIST" ]; then
    say "downloading $SDIST from PyPI (76 MB)"
    tmp=$(mktemp -d "$DIR/dl.XXXXXX")
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$VERSION" -d "$tmp" \
      >/dev/null 2>&1 || python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" \
      || fail "pip download llama-cpp-python==$VERSION failed"
    mv "$tmp/$SDIST" "$DIR/$SDIST" && rm -rf "$tmp"
  fi
  got=$(sha256sum "$DIR/$SDIST" | cut -d' ' -f1)
  [ "$got" = "$SDIST_SHA256" ] || { rm -f "$DIR/$SDIST"; fail "sha256 mismatch for $SDIST: got $got, want $SDIST_SHA256"; }
  say "unpacking $SDIST"
  rm -rf "$DIR/src" && mkdir -p "$DIR/src"
  tar xzf "$DIR/$SDIST" -C "$DIR/src" || fail "could not unpack $DIR/$SDIST"
fi

if [ "$mode" = --src ]; then echo "$SRC"; exit 0; fi

if [ ! -f "$STAMP" ]; then
  say "building ${TARGETS[*]} for the CPU in $BUILD (about 15 minutes on 2 cores)"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >"$DIR/configure.log" 2>&1 || fail "cmake configure failed (see $DIR/configure.log)"
  cmake --build "$BUILD" -j"$(nproc)" --target "${TARGETS[@]}" >"$DIR/build.log" 2>&1 \
    || fail "build failed (see $DIR/build.log)"
  touch "$STAMP"
fi

if [ ! -x "$ORACLE" ]; then
  say "building llama_oracle from $ORACLE_SRC"
  mkdir -p "$(dirname "$ORACLE")"
  "${CXX:-c++}" -std=c++17 -O2 -Wall -o "$ORACLE.tmp" "$ORACLE_SRC" -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$BIN" -lllama -lggml -lggml-base -Wl,-rpath,"$BIN" >"$DIR/oracle.log" 2>&1 \
    || fail "llama_oracle did not build (see $DIR/oracle.log)"
  mv "$ORACLE.tmp" "$ORACLE"
fi
echo "$BIN"
