#!/usr/bin/env bash
# wgllm beside llama.cpp on the same GGUF files, in one run: `wgllm bench` and `llama-bench` (pp and tg tokens/s),
# printed as one Markdown table with the ratios. Meant for a GPU machine (llama.cpp built there with CUDA).
#
#   scripts/bench_vs_llamacpp.sh build-cuda SRC_TARBALL BUILD_DIR
#       unpack a llama.cpp source tarball (vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist, stripped of
#       models/docs/tests) and build llama-bench and llama-quantize with CUDA (sm_90) into BUILD_DIR/bin
#   scripts/bench_vs_llamacpp.sh compare WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] MODEL...
#       for each model: llama-bench -ngl 99 -fa 1 and wgllm bench, medians, the table on stdout, the raw JSON of
#       both under $BENCH_OUT (default /tmp/bench_vs_llamacpp)
#   scripts/bench_vs_llamacpp.sh batched WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] [--npl 1,4,16,64] MODEL...
#       concurrent streams: wgllm bench --parallel (continuous batching) beside llama-batched-bench (-npp -ntg -npl;
#       S_TG, the aggregate generation t/s); a table per model with each side's ratio to its own single stream
set -euo pipefail

say()  { printf '[bench_vs_llamacpp] %s\n' "$*" >&2; }
fail() { printf '[bench_vs_llamacpp] error: %s\n' "$*" >&2; exit 1; }

build_cuda() {
  local tarball=$1 dir=$2
  [ -f "$tarball" ] || fail "no source tarball at $tarball"
  mkdir -p "$dir/src"
  tar xJf "$tarball" -C "$dir/src"
  local top src
  top=$(find "$dir/src" -maxdepth 5 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -n1)
  [ -n "$top" ] || fail "no llama.cpp/CMakeLists.txt in $tarball"
  src=$(dirname "$top")
  say "building llama.cpp with CUDA in $dir"
  cmake -S "$src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$dir/configure.log" \
    || fail "configure failed (see $dir/configure.log)"
  ninja -C "$dir/build" llama-bench llama-batched-bench llama-quantize >"$dir/build.log" || { tail -30 "$dir/build.log"; fail "build failed"; }
  echo "$dir/build/bin"
}

compare() {
  local wgllm=$1 lbin=$2; shift 2
  local p=512 n=128 r=5 models=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -p) p=$2; shift 2 ;; -n) n=$2; shift 2 ;; -r) r=$2; shift 2 ;;
      *) models+=("$1"); shift ;;
    esac
  done
  [ ${#models[@]} -gt 0 ] || fail "no model files given"
  local out=${BENCH_OUT:-/tmp/bench_vs_llamacpp}
  mkdir -p "$out"
  printf '| model | pp%s wgllm | pp%s llama.cpp | ratio | tg%s wgllm | tg%s llama.cpp | ratio |\n' "$p" "$p" "$n" "$n"
  printf '|---|---|---|---|---|---|---|\n'
  for m in "${models[@]}"; do
    local stem
    stem=$(basename "$m" .gguf)
    say "$stem: llama-bench"
    "$lbin/llama-bench" -m "$m" -ngl 99 -fa 1 -p "$p" -n "$n" -r "$r" -o json >"$out/$stem.llama.json" 2>"$out/$stem.llama.err" \
      || { tail -5 "$out/$stem.llama.err"; fail "llama-bench failed on $m"; }
    say "$stem: wgllm bench"
    "$wgllm" bench -m "$m" -p "$p" -n "$n" -r "$r" --json >"$out/$stem.wgllm.json" 2>"$out/$stem.wgllm.err" \
      || { tail -5 "$out/$stem.wgllm.err"; fail "wgllm bench failed on $m"; }
    python3 - "$out/$stem.llama.json" "$out/$stem.wgllm.json" "$stem" <<'EOF'
import json, statistics, sys
llama = json.load(open(sys.argv[1]))
wg = json.load(open(sys.argv[2]))
def lc(kind):
    for t in llama:
        if (kind == "pp" and t["n_prompt"] > 0 and t["n_gen"] == 0) or (kind == "tg" and t["n_gen"] > 0 and t["n_prompt"] == 0):
            return statistics.median(t["samples_ts"])
    return float("nan")
def wl(kind):
    return wg.get(kind, {}).get("tokens_per_s", float("nan"))
pw, pl, tw, tl = wl("pp"), lc("pp"), wl("tg"), lc("tg")
print(f"| {sys.argv[3]} | {pw:,.0f} | {pl:,.0f} | {pw / pl:.2f} | {tw:,.1f} | {tl:,.1f} | {tw / tl:.2f} |")
EOF
  done
}

batched() {
  local wgllm=$1 lbin=$2; shift 2
  local p=128 n=128 r=3 npl=1,4,16,64 models=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -p) p=$2; shift 2 ;; -n) n=$2; shift 2 ;; -r) r=$2; shift 2 ;; --npl) npl=$2; shift 2 ;;
      *) models+=("$1"); shift ;;
    esac
  done
  [ ${#models[@]} -gt 0 ] || fail "no model files given"
  local out=${BENCH_OUT:-/tmp/bench_vs_llamacpp}
  mkdir -p "$out"
  local most=${npl##*,}
  for m in "${models[@]}"; do
    local stem
    stem=$(basename "$m" .gguf)
    say "$stem: llama-batched-bench"
    "$lbin/llama-batched-bench" -m "$m" -ngl 99 -fa 1 -c $((most * (p + n) + 256)) -b 2048 -ub 512 -npp "$p" -ntg "$n" \
      -npl "$npl" --output-format jsonl >"$out/$stem.batched.jsonl" 2>"$out/$stem.batched.err" \
      || { tail -5 "$out/$stem.batched.err"; fail "llama-batched-bench failed on $m"; }
    say "$stem: wgllm bench --parallel"
    "$wgllm" bench -m "$m" -p "$p" -n "$n" -r "$r" --parallel "$npl" --json >"$out/$stem.wgllm-parallel.json" \
      2>"$out/$stem.wgllm-parallel.err" || { tail -5 "$out/$stem.wgllm-parallel.err"; fail "wgllm bench failed on $m"; }
    python3 - "$out/$stem.batched.jsonl" "$out/$stem.wgllm-parallel.json" "$stem" "$p" "$n" <<'EOF'
import json, sys
llama = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        j = json.loads(line)
        llama[j["pl"]] = j["speed_tg"]
wg = {e["streams"]: e["tokens_per_s"] for e in json.load(open(sys.argv[2])).get("parallel", [])}
print(f"\n{sys.argv[3]}: pp{sys.argv[4]} + tg{sys.argv[5]} per stream, aggregate generation t/s")
print("| streams | wgllm | vs 1 stream | llama.cpp S_TG | vs 1 stream | wgllm / llama.cpp |")
print("|---|---|---|---|---|---|")
w1, l1 = wg.get(1), llama.get(1)
nan = float("nan")
for k in sorted(set(wg) | set(llama)):
    w, l = wg.get(k, nan), llama.get(k, nan)
    print(f"| {k} | {w:,.1f} | {w / w1 if w1 else nan:.2f}x | {l:,.1f} | {l / l1 if l1 else nan:.2f}x | {w / l:.2f} |")
EOF
  done
}

cmd=${1:-}
case "$cmd" in
  build-cuda) [ $# -eq 3 ] || fail "usage: $0 build-cuda SRC_TARBALL BUILD_DIR"; build_cuda "$2" "$3" ;;
  compare) [ $# -ge 4 ] || fail "usage: $0 compare WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] MODEL..."; shift; compare "$@" ;;
  batched) [ $# -ge 4 ] || fail "usage: $0 batched WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] [--npl LIST] MODEL..."
           shift; batched "$@" ;;
  *) fail "usage: $0 build-cuda SRC_TARBALL BUILD_DIR | compare WGLLM LLAMA_BIN_DIR ... | batched WGLLM LLAMA_BIN_DIR ..." ;;
esac
