#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz_gguf, fuzz_tokenizer, fuzz_jinja) with clang into a build folder of their own and runs
# each for a while from its seeds; any crash, leak or failed check fails. Without clang++ and libFuzzer it says so
# and exits 77 (CTest's "skipped").
#   scripts/fuzz.sh [seconds per target, default 60]
#   WGLLM_BUILD_DIR        the normal build (default build/): its wgllm_tests writes the GGUF seeds
#   WGLLM_FUZZ_BUILD_DIR   where the fuzz targets are built (default build-fuzz/)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SECONDS_EACH=${1:-60}
BUILD_DIR=${WGLLM_BUILD_DIR:-"$ROOT/build"}
FUZZ_DIR=${WGLLM_FUZZ_BUILD_DIR:-"$ROOT/build-fuzz"}

say() { printf '[fuzz] %s\n' "$*"; }

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cpp"
if ! command -v clang++ >/dev/null; then
  say "SKIPPED: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)"
  exit 77
fi
if ! clang++ -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
  say "SKIPPED: clang++ cannot link libFuzzer programs (install libclang-rt-14-dev): $(head -c 300 "$probe/err")"
  exit 77
fi

say "building the fuzz targets in $FUZZ_DIR"
cmake -S "$ROOT" -B "$FUZZ_DIR" -DWGLLM_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DWGLLM_WERROR=ON -DWGLLM_BUILD_BENCH=OFF >/dev/null
cmake --build "$FUZZ_DIR" -j"$(nproc)" --target fuzz_gguf fuzz_tokenizer fuzz_jinja >/dev/null

# GGUF seeds come from the test that writes them; the tokenizer's and the chat templates' are committed.
gguf_seeds="$BUILD_DIR/fuzz_seeds"
if [ -x "$BUILD_DIR/bin/wgllm_tests" ]; then
  "$BUILD_DIR/bin/wgllm_tests" --gtest_filter='GgufSeeds.*' >/dev/null
fi
mkdir -p "$gguf_seeds"

status=0
for target in gguf tokenizer jinja; do
  seeds="$gguf_seeds"
  [ "$target" = tokenizer ] && seeds="$ROOT/tests/fuzz/seeds/tokenizer"
  [ "$target" = jinja ] && seeds="$ROOT/tests/fuzz/seeds/jinja"
  corpus="$FUZZ_DIR/corpus/$target"
  mkdir -p "$corpus" "$FUZZ_DIR/artifacts"
  say "fuzz_$target for ${SECONDS_EACH} s from $seeds"
  if "$FUZZ_DIR/bin/fuzz_$target" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$FUZZ_DIR/artifacts/$target-" "$corpus" "$seeds" >"$FUZZ_DIR/fuzz_$target.log" 2>&1; then
    say "fuzz_$target: $(grep -E 'stat::number_of_executed_units' "$FUZZ_DIR/fuzz_$target.log" | awk '{print $2}') runs, no finding"
  else
    status=1
    tail -n 40 "$FUZZ_DIR/fuzz_$target.log"
    say "fuzz_$target FAILED: the input is in $FUZZ_DIR/artifacts/ (replay: $FUZZ_DIR/bin/fuzz_$target FILE)"
  fi
done
exit $status
