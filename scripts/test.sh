#!/usr/bin/env bash
# Installs what the tests need, builds (warnings are errors) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
WGLLM_TEST_PACKAGES=1 WGLLM_CMAKE_ARGS="-DWGLLM_WERROR=ON ${WGLLM_CMAKE_ARGS:-}" scripts/setup.sh
# The references for real files, cached outside the tree: Gemma 3 270M Q4_K_M, the llama.cpp oracle, and the
# Gemma file's F32 twin (llama.cpp's exact-arithmetic stand-in for it).
tools/fetch_gemma.sh >/dev/null
tools/llamacpp.sh >/dev/null
tools/fetch_gemma.sh --f32 >/dev/null
build="${WGLLM_BUILD_DIR:-build}"
status=0
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  # The failures' output again, last, where a log's tail shows it (and whether they fail alone); the run stays failed.
  echo "[test] failed; running the failed tests again, one at a time, to show their output:"
  ctest --test-dir "$build" --rerun-failed --output-on-failure -j1 || true
  exit "$status"
fi
