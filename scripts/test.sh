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
ctest --test-dir "${WGLLM_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
