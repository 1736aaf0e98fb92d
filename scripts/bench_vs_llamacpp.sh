#!/usr/bin/env bash
# wgllm beside llama.cpp (CUDA and Vulkan builds) on the same GGUF files: `wgllm bench` and `llama-bench` (pp and tg
# tokens/s), printed as Markdown tables with the ratios. The builds and the benchmarks run on a GPU machine; the
# source and the Vulkan toolchain are prepared on a Debian 12 machine with network and carried there.
#
# Prepare (Debian 12, network):
#   scripts/bench_vs_llamacpp.sh prepare-source SDIST_TARBALL OUT_TAR_XZ
#       vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist, stripped to what the CUDA and Vulkan builds of
#       llama-bench need (no models, docs, tests, examples, web UI, other backends), checked to configure, as tar.xz
#   scripts/bench_vs_llamacpp.sh prepare-vulkan-debs DIR
#       Debian trixie's glslc, libshaderc1, libvulkan-dev, spirv-headers, libvulkan1 (the loader) and libglvnd0
#       (libGLdispatch, which NVIDIA's Vulkan driver needs) as .deb files in DIR, from the mirror of the system's own
#       suite (apt-get download with a private sources list and state directory: the system's apt is left untouched)
#   scripts/bench_vs_llamacpp.sh pack BUILD_DIR DIR
#       everything the GPU machine needs in one folder to carry there: wgllm and wgllm-bench of BUILD_DIR stripped,
#       with the shared libraries they need beyond a base system's (bin/), llama-src.tar.xz (prepare-source of the
#       sdist tools/llamacpp.sh --src fetches and checks), the gguf wheel tools/make_model.py needs (wheels/), this
#       system's Vulkan loader and glvnd libraries (debs/), the cached CPU build's llama-quantize where there is one
#       (quantize/) and env.sh; there `source DIR/env.sh` installs the debs (as root into /, else unpacked into DIR),
#       unpacks the wheel, sets LD_LIBRARY_PATH, PYTHONPATH, WGLLM, WGLLM_BENCH and LLAMA_SRC, VK_DRIVER_FILES where
#       NVIDIA's ICD file sits in /usr/local/nvidia, and LLAMA_QUANTIZE (also on PATH). About 30 MB.
# Build (GPU machine; each build resumes where it stopped when run again):
#   scripts/bench_vs_llamacpp.sh unpack-debs DIR PREFIX
#       dpkg -x each .deb of DIR into PREFIX (trixie's glslc needs glibc >= 2.38 and libstdc++ from GCC >= 13)
#   scripts/bench_vs_llamacpp.sh build-cuda SRC_TARBALL BUILD_DIR
#   scripts/bench_vs_llamacpp.sh build-vulkan SRC_TARBALL VK_PREFIX BUILD_DIR
#       llama-bench, llama-batched-bench and llama-quantize with CUDA (sm_90), or with Vulkan against the headers,
#       loader, glslc and SPIRV-Headers unpacked in VK_PREFIX, into BUILD_DIR/build/bin ($JOBS parallel jobs,
#       default all cores)
# Benchmark:
#   scripts/bench_vs_llamacpp.sh table WGLLM CUDA_BIN_DIR VULKAN_BIN_DIR [-r N] [-p N] [-n N] [-d N]
#                                      [--vk-prefix VK_PREFIX] [--models-dir DIR] [--tiny] [--rows ID,...]
#       makes the model files with tools/make_model.py if missing (Llama-3.2-1B F16, Q8_0 and Q4_K_M, Qwen2.5-0.5B
#       F16, Qwen3-0.6B F16, Qwen3.5-0.8B F16 and Q4_K_M, Gemma 3 270M and LFM2-350M Q4_K_M, Llama-3.1-8B F16 and
#       Q4_K_M, Qwen3-30B-A3B and LFM2-8B-A1B Q4_K_M, gpt-oss-20b MXFP4_MOE; random weights, real shapes; needs
#       numpy and gguf; the Q4_K_M files are the F16 ones through the llama-quantize of the first bin dir that has
#       one, else $LLAMA_QUANTIZE, Qwen3-30B-A3B's its Q8_0 one), runs llama-bench -ngl 99 -fa 1 with each build and
#       wgllm bench greedy and sampled (--temp 0.8 --top-p 0.9 --top-k 40) on each, the Llama F16 file again at
#       depth -d (4096); prints the table of wgllm's tok/s with its ratio to each llama.cpp build, then all medians
#       [min, max]. "-" as a bin dir skips that build (both "-": wgllm alone). Defaults -r 5 -p 512 -n 128;
#       --vk-prefix puts VK_PREFIX's libraries (trixie's Vulkan loader) first on LD_LIBRARY_PATH for every run,
#       wgllm's included; --models-dir default ${TMPDIR:-/tmp}/wgllm-bench-models; --tiny: 2-layer, 64-wide models
#       of the same architectures (a smoke run; pair with small -p -n -d); --rows: only the rows of these ids
#       (TABLE_ROWS below)
#   scripts/bench_vs_llamacpp.sh compare WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] MODEL...
#       for each model: llama-bench -ngl 99 -fa 1 and wgllm bench, medians, one table
#   scripts/bench_vs_llamacpp.sh batched WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] [--npl 1,4,16,64] MODEL...
#       concurrent streams: wgllm bench --parallel (continuous batching) beside llama-batched-bench (-npp -ntg -npl;
#       S_TG, the aggregate generation t/s); a table per model with each side's ratio to its own single stream
#
# Tables go to stdout, progress to stderr; every run's JSON and log lands under $BENCH_OUT (default
# /tmp/bench_vs_llamacpp). The JSON is read by scripts/bench_report.py.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
PY=${PYTHON:-python3}
REPORT=("$PY" "$HERE/bench_report.py")
VK_PACKAGES=(glslc libshaderc1 libvulkan-dev spirv-headers libvulkan1 libglvnd0)
VK_LIBDIR=usr/lib/x86_64-linux-gnu
SAMPLING=(--temp 0.8 --top-p 0.9 --top-k 40)
# the parts of vendor/llama.cpp that no CUDA or Vulkan build of llama-bench reads
STRIP=(.git .github .devops .gemini .pi models docs media tests examples pocs benches ci skills gguf-py conversion
       grammars requirements scripts app 'convert_*.py' tools/ui 'tools/server/public*' tools/server/tests
       tools/server/bench tools/mtmd/tests tools/mtmd/test-1.jpeg tools/mtmd/test-2.mp3 tools/mtmd/test-3.mp4
       ggml/src/ggml-{sycl,cann,musa,hip,opencl,metal,webgpu,hexagon,openvino,et,zdnn,zendnn,virtgpu,rpc})
# the configure flags shared by every build here
LLAMA_CMAKE=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
             -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF)

say()  { printf '[bench_vs_llamacpp] %s\n' "$*" >&2; }
fail() { printf '[bench_vs_llamacpp] error: %s\n' "$*" >&2; exit 1; }
TMPDIRS=()
trap '[ ${#TMPDIRS[@]} -eq 0 ] || rm -rf "${TMPDIRS[@]}"' EXIT
out_dir() { local o=${BENCH_OUT:-/tmp/bench_vs_llamacpp}; mkdir -p "$o"; (cd "$o" && pwd); }

# --- preparing (on a Debian 12 machine with network) -------------------------------------------------------------

prepare_source() {
  local sdist=$1 dest=$2
  [ -f "$sdist" ] || fail "no sdist at $sdist"
  local tmp
  tmp=$(mktemp -d)
  TMPDIRS+=("$tmp")
  say "unpacking vendor/llama.cpp of $sdist"
  tar xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/*' '*/.git/*'
  local src
  src=$(find "$tmp" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n1)
  [ -f "$src/CMakeLists.txt" ] || fail "no vendor/llama.cpp in $sdist"
  # the commit, for llama-bench's build_commit (the stripped tree has no git metadata)
  git -C "$src" rev-parse --short HEAD >"$tmp/commit" 2>/dev/null || echo unknown >"$tmp/commit"
  (cd "$src" && shopt -s nullglob && eval "rm -rf ${STRIP[*]}")
  cp "$tmp/commit" "$src/BUILD_COMMIT"
  say "checking that the stripped tree configures (CPU only)"
  cmake -S "$src" -B "$tmp/check" "${LLAMA_CMAKE[@]}" -DGGML_NATIVE=OFF >"$tmp/check.log" 2>&1 \
    || { tail -20 "$tmp/check.log" >&2; fail "the stripped source does not configure"; }
  mkdir -p "$(dirname "$dest")"
  XZ_OPT=-9 tar cJf "$dest.part" --sort=name --owner=0 --group=0 --numeric-owner -C "$(dirname "$src")" llama.cpp
  mv "$dest.part" "$dest"
  say "$dest: $(du -h "$dest" | cut -f1), llama.cpp $(cat "$tmp/commit")"
}

prepare_vulkan_debs() {
  local dir=$1 suite=${DEBIAN_SUITE:-trixie} keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  command -v apt-get >/dev/null || fail "apt-get not found (prepare-vulkan-debs runs on Debian)"
  [ -f "$keyring" ] || fail "no $keyring (package debian-archive-keyring)"
  # the mirror the system takes its own suite from
  local codename mirror
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  mirror=${DEBIAN_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
                            awk -v s="$codename" '$2 == s { print $1; exit }')}
  mirror=${mirror:-http://deb.debian.org/debian/}
  local apt
  apt=$(mktemp -d)
  TMPDIRS+=("$apt")
  mkdir -p "$apt"/{lists/partial,archives/partial,etc/sources.list.d,etc/preferences.d}
  : >"$apt/status"
  echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt/etc/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/etc/sources.list" -o "Dir::Etc::SourceParts=$apt/etc/sources.list.d"
              -o "Dir::Etc::Preferences=$apt/etc/preferences" -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
              -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=$apt/status"
              -o "Dir::Cache=$apt" -o "Dir::Cache::archives=$apt/archives" -o Debug::NoLocking=1)
  say "fetching the $suite package list from $mirror (private state in $apt)"
  apt-get "${opts[@]}" -q update >"$apt/update.log" 2>&1 \
    || { cat "$apt/update.log" >&2; fail "apt-get update ($suite) failed"; }
  # every dependency of the set outside it must be one the target system brings (C/C++ runtimes, python3)
  local missing
  missing=$(apt-cache "${opts[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
              --no-enhances "${VK_PACKAGES[@]}" | awk '/^ *Depends:/ { print $2 }' | sed 's/[<>]//g; s/:any$//' |
            sort -u | grep -vxF -e libc6 -e libgcc-s1 -e libstdc++6 -e python3 "${VK_PACKAGES[@]/#/-e}" || true)
  [ -z "$missing" ] || say "warning: $suite's ${VK_PACKAGES[*]} also depend on: $missing"
  mkdir -p "$dir"
  (cd "$dir" && apt-get "${opts[@]}" -q download "${VK_PACKAGES[@]}") >"$apt/download.log" 2>&1 \
    || { cat "$apt/download.log" >&2; fail "apt-get download failed"; }
  ls -1 "$dir"/*.deb >&2
  say "$dir: $(du -ch "$dir"/*.deb | tail -1 | cut -f1)"
}

pack() {
  local build=$1 dir=$2
  for f in wgllm wgllm-bench; do [ -x "$build/bin/$f" ] || fail "no $build/bin/$f (build wgllm first)"; done
  mkdir -p "$dir/bin" "$dir/wheels"
  dir=$(cd "$dir" && pwd)
  local f lib
  for f in wgllm wgllm-bench; do strip -o "$dir/bin/$f" "$build/bin/$f"; done
  # the shared libraries beyond the C/C++ runtimes, zlib and OpenSSL, which any GPU machine's system has
  while read -r lib; do
    case "${lib##*/}" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so* | \
        libz.so* | libssl.so* | libcrypto.so*) ;;
      *) cp -L "$lib" "$dir/bin/" ;;
    esac
  done < <(ldd "$build/bin/wgllm" "$build/bin/wgllm-bench" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels" gguf==0.19.0 \
    || fail "pip download gguf==0.19.0 failed"
  local src sdist
  src=$("$REPO/tools/llamacpp.sh" --src)
  sdist=$(find "${src%/src/*}" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -n1)
  [ -f "$sdist" ] || fail "tools/llamacpp.sh --src left no sdist beside $src"
  [ -f "$dir/llama-src.tar.xz" ] || prepare_source "$sdist" "$dir/llama-src.tar.xz"
  # the Vulkan loader and the GL dispatch libraries of this system's own suite, for a GPU machine whose system has no
  # loader: NVIDIA's Vulkan driver (libGLX_nvidia) finds no instance functions without the whole glvnd set
  local pkgs=(libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2) p
  for p in "${pkgs[@]}"; do
    ls "$dir"/debs/"${p}"_*.deb >/dev/null 2>&1 && continue
    mkdir -p "$dir/debs"
    (cd "$dir/debs" && apt-get download "$p") >/dev/null 2>&1 \
      || fail "apt-get download $p failed (apt-get update first?)"
  done
  # llama-quantize of the CPU build tools/llamacpp.sh caches, with its libraries, where there is one: Q4_K_M files
  # without building llama.cpp there (built for this machine's processor: GGML_NATIVE)
  local lc
  if lc=$("$REPO/tools/llamacpp.sh" --bin 2>/dev/null) && [ -x "$lc/llama-quantize" ]; then
    mkdir -p "$dir/quantize"
    strip -o "$dir/quantize/llama-quantize.bin" "$lc/llama-quantize"
    while read -r lib; do cp -L "$lib" "$dir/quantize/"; done < <(ldd "$lc/llama-quantize" |
      awk -v d="$lc" '$2 == "=>" && index($3, d) == 1 { print $3 }')
    cat >"$dir/quantize/llama-quantize" <<'WRAP'
#!/bin/sh
# llama-quantize with its libraries beside it
d=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/llama-quantize.bin" "$@"
WRAP
    chmod +x "$dir/quantize/llama-quantize"
  fi
  cat >"$dir/env.sh" <<'ENV'
# Sourced on the GPU machine (bash): the Vulkan loader and GL dispatch libraries installed (as root: into /, as NVIDIA's
# driver needs them; else unpacked here) and the gguf wheel unpacked here, once; then the paths.
P=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ "$(id -u)" = 0 ] && command -v dpkg >/dev/null; then
  if [ ! -f "$P/.installed" ]; then
    for d in "$P"/debs/*.deb; do dpkg -x "$d" /; done
    ldconfig && touch "$P/.installed"
  fi
elif [ ! -d "$P/vk" ]; then
  for d in "$P"/debs/*.deb; do dpkg-deb -x "$d" "$P/vk"; done
fi
if [ ! -d "$P/site" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$P/site" "$P"/wheels/*.whl >/dev/null 2>&1 \
    || echo "env.sh: the wheels of $P/wheels did not install" >&2
fi
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export LD_LIBRARY_PATH="$P/bin:$P/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$P/site${PYTHONPATH:+:$PYTHONPATH}"
export WGLLM="$P/bin/wgllm" WGLLM_BENCH="$P/bin/wgllm-bench" LLAMA_SRC="$P/llama-src.tar.xz"
# llama-quantize IN OUT TYPE THREADS on PATH and as $LLAMA_QUANTIZE (where the pack has it; `table` takes it)
if [ -x "$P/quantize/llama-quantize" ]; then
  export LLAMA_QUANTIZE="$P/quantize/llama-quantize" PATH="$P/quantize:$PATH"
fi
ENV
  say "$dir: $(du -sh "$dir" | cut -f1)"
}

# --- building (on the GPU machine) -------------------------------------------------------------------------------

unpack_debs() {
  local dir=$1 prefix=$2
  local debs=("$dir"/*.deb)
  [ -f "${debs[0]}" ] || fail "no .deb files in $dir"
  mkdir -p "$prefix"
  for d in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$prefix"
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      local member
      member=$(ar t "$d" | grep '^data\.tar') || fail "no data.tar in $d"
      case "$member" in
        *.xz) ar p "$d" "$member" | tar xJ -C "$prefix" ;;
        *.zst) ar p "$d" "$member" | zstd -dc | tar x -C "$prefix" ;;
        *.gz) ar p "$d" "$member" | tar xz -C "$prefix" ;;
        *) ar p "$d" "$member" | tar x -C "$prefix" ;;
      esac
    fi
  done
  say "unpacked ${#debs[@]} packages into $prefix"
}

# unpack SRC_TARBALL into DIR/src once, configure DIR/build once, then build the targets (ninja resumes)
build_llama() {
  local what=$1 tarball=$2 dir=$3
  shift 3
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local top
  # (no source unpacked yet: find fails, which must not end the script under pipefail)
  top=$(find "$dir/src" -maxdepth 5 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' 2>/dev/null | head -n1 || true)
  if [ -z "$top" ]; then
    [ -f "$tarball" ] || fail "no source tarball at $tarball"
    mkdir -p "$dir/src"
    tar xJf "$tarball" -C "$dir/src"
    top=$(find "$dir/src" -maxdepth 5 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -n1)
    [ -n "$top" ] || fail "no llama.cpp/CMakeLists.txt in $tarball"
  fi
  local src commit=()
  src=$(dirname "$top")
  [ -f "$src/BUILD_COMMIT" ] && commit=(-DLLAMA_BUILD_COMMIT="$(cat "$src/BUILD_COMMIT")")
  if [ ! -f "$dir/build/build.ninja" ]; then
    say "configuring llama.cpp with $what in $dir/build"
    cmake -S "$src" -B "$dir/build" "${LLAMA_CMAKE[@]}" "${commit[@]}" "$@" >"$dir/configure.log" 2>&1 \
      || { tail -20 "$dir/configure.log" >&2; fail "configure failed (see $dir/configure.log)"; }
  fi
  local jobs=${JOBS:-$(nproc)} t0=$SECONDS
  say "building llama-bench, llama-batched-bench, llama-quantize with $what, $jobs jobs (log: $dir/build.log)"
  ninja -C "$dir/build" -j "$jobs" llama-bench llama-batched-bench llama-quantize >"$dir/build.log" 2>&1 \
    || { tail -30 "$dir/build.log" >&2; fail "build with $what failed"; }
  say "built with $what in $((SECONDS - t0)) s: $dir/build/bin"
  echo "$dir/build/bin"
}

build_cuda() {
  build_llama CUDA "$1" "$2" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
}

build_vulkan() {
  local tarball=$1 prefix=$2 dir=$3
  [ -d "$prefix" ] || fail "no Vulkan prefix at $prefix (unpack-debs first)"
  prefix=$(cd "$prefix" && pwd)
  export LD_LIBRARY_PATH="$prefix/$VK_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local glslc=$prefix/usr/bin/glslc
  "$glslc" --version >/dev/null 2>&1 || { "$glslc" --version >&2 || true
    fail "$glslc does not run here (trixie's glslc needs glibc >= 2.38 and libstdc++ from GCC >= 13)"; }
  build_llama Vulkan "$tarball" "$dir" -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR="$prefix/usr/include" \
    -DVulkan_LIBRARY="$prefix/$VK_LIBDIR/libvulkan.so" -DVulkan_GLSLC_EXECUTABLE="$glslc" \
    -DSPIRV-Headers_DIR="$prefix/usr/share/cmake/SPIRV-Headers"
}

# --- benchmarking ------------------------------------------------------------------------------------------------

# the rows of `table`: id | label | make_model.py shape | type | at depth (1: -d)
TABLE_ROWS=(
  "llama-3.2-1b-f16|Llama-3.2-1B F16|llama-3.2-1b|f16|0"
  "llama-3.2-1b-q8_0|Llama-3.2-1B Q8_0|llama-3.2-1b|q8_0|0"
  "qwen2.5-0.5b-f16|Qwen2.5-0.5B F16|qwen2.5-0.5b|f16|0"
  "qwen3-0.6b-f16|Qwen3-0.6B F16|qwen3-0.6b|f16|0"
  "qwen3.5-0.8b-f16|Qwen3.5-0.8B F16|qwen3.5-0.8b|f16|0"
  "llama-3.2-1b-f16-depth|Llama-3.2-1B F16, depth DEPTH|llama-3.2-1b|f16|1"
  "llama-3.2-1b-q4_k_m|Llama-3.2-1B Q4_K_M|llama-3.2-1b|q4_k_m|0"
  "gemma-3-270m-q4_k_m|Gemma 3 270M Q4_K_M|gemma-3-270m|q4_k_m|0"
  "lfm2-350m-q4_k_m|LFM2-350M Q4_K_M|lfm2-350m|q4_k_m|0"
  "qwen3.5-0.8b-q4_k_m|Qwen3.5-0.8B Q4_K_M|qwen3.5-0.8b|q4_k_m|0"
  "gemma4-small-f16|Gemma 4 small (E2B's shape) F16|gemma4-small|f16|0"
  "gemma4-small-q4_k_m|Gemma 4 small (E2B's shape) Q4_K_M|gemma4-small|q4_k_m|0"
  "llama-3.1-8b-f16|Llama-3.1-8B F16|llama-3.1-8b|f16|0"
  "llama-3.1-8b-q4_k_m|Llama-3.1-8B Q4_K_M|llama-3.1-8b|q4_k_m|0"
  "qwen3-30b-a3b-q4_k_m|Qwen3-30B-A3B Q4_K_M|qwen3-30b-a3b|q4_k_m|0"
  "lfm2-8b-a1b-q4_k_m|LFM2-8B-A1B Q4_K_M|lfm2-8b-a1b|q4_k_m|0"
  "gpt-oss-20b-mxfp4_moe|gpt-oss-20b MXFP4 (experts; the rest Q8_0)|gpt-oss-20b|mxfp4_moe|0"
)
# types made with llama-quantize from the shape's F16 file (llama.cpp's own mixes: Q4_K_M is Q4_K with Q6_K for
# half of attn_v / ffn_down and the output); from its Q8_0 file (--allow-requantize) for the shapes listed in
# QUANTIZE_FROM, whose F16 file would not fit the disk beside the rest (Qwen3-30B-A3B: 61 GB in F16, 32 GB in Q8_0;
# gpt-oss-20b 42 and 22 GB). MXFP4_MOE is llama.cpp's gpt-oss mix: the experts in MXFP4, the rest as in the source.
QUANTIZED_TYPES=(q4_k_m mxfp4_moe)
declare -A QUANTIZE_FROM=([qwen3-30b-a3b]=q8_0 [gpt-oss-20b]=q8_0)
# (Qwen 3.5's two tiny layers: a DeltaNet layer, then an attention layer)
TINY=(--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --head-dim 16 --n-ff 128 --n-vocab 1024 --ctx 8192
      --full-attention-interval 2)

table() {
  local wgllm=$1 cuda=$2 vulkan=$3
  shift 3
  local p=512 n=128 r=5 depth=4096 models=${TMPDIR:-/tmp}/wgllm-bench-models tiny=0 only=''
  while [ $# -gt 0 ]; do
    case "$1" in
      -p) p=$2; shift 2 ;; -n) n=$2; shift 2 ;; -r) r=$2; shift 2 ;; -d) depth=$2; shift 2 ;;
      --models-dir) models=$2; shift 2 ;; --tiny) tiny=1; shift ;;
      --rows) only=",$2,"; shift 2 ;;
      --vk-prefix) [ -d "$2/$VK_LIBDIR" ] || fail "no $2/$VK_LIBDIR (unpack-debs first)"
                   LD_LIBRARY_PATH="$(cd "$2/$VK_LIBDIR" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                   export LD_LIBRARY_PATH; shift 2 ;;
      *) fail "table: unknown option '$1'" ;;
    esac
  done
  [ -x "$wgllm" ] || fail "no wgllm executable at $wgllm"
  local b
  for b in "$cuda" "$vulkan"; do
    [ "$b" = - ] || [ -x "$b/llama-bench" ] || fail "no llama-bench in $b (pass - to skip that build)"
  done
  local out
  out=$(out_dir)
  mkdir -p "$models"

  # model files, made in parallel, each written whole before it is used
  local row id label shape type at file suffix='' extra=() pids=()
  [ $tiny = 1 ] && suffix=-tiny && extra=("${TINY[@]}")
  declare -A file_of=() make_args=() quantize_from=()
  local table_rows=() qt
  for row in "${TABLE_ROWS[@]}"; do
    IFS='|' read -r id label shape type at <<<"$row"
    [ -z "$only" ] || [[ "$only" == *",$id,"* ]] || continue
    table_rows+=("$row")
    file=$models/$shape-$type$suffix.gguf
    file_of[$id]=$file
    [ -f "$file" ] && continue
    for qt in "${QUANTIZED_TYPES[@]}"; do
      if [ "$type" = "$qt" ]; then
        local src=${QUANTIZE_FROM[$shape]:-f16}
        quantize_from[$file]=$models/$shape-$src$suffix.gguf
        [ -f "${quantize_from[$file]}" ] || make_args[${quantize_from[$file]}]="--shape $shape --type $src"
        continue 2
      fi
    done
    make_args[$file]="--shape $shape --type $type"
  done
  [ ${#table_rows[@]} -gt 0 ] || fail "--rows: no row is named '${only//,/ }'"
  local quantize=''
  if [ ${#quantize_from[@]} -gt 0 ]; then
    for b in "$cuda" "$vulkan"; do [ "$b" != - ] && [ -x "$b/llama-quantize" ] && quantize=$b/llama-quantize && break; done
    [ -n "$quantize" ] || [ ! -x "${LLAMA_QUANTIZE:-}" ] || quantize=$LLAMA_QUANTIZE
    [ -n "$quantize" ] \
      || fail "the Q4_K_M rows need llama-quantize beside llama-bench in a bin dir, or \$LLAMA_QUANTIZE"
  fi
  if [ ${#make_args[@]} -gt 0 ]; then
    "$PY" -c 'import numpy, gguf' 2>/dev/null \
      || fail "tools/make_model.py needs the Python packages numpy and gguf (pip install gguf, or PYTHONPATH)"
    local t0=$SECONDS
    for file in "${!make_args[@]}"; do
      say "making $file"
      # shellcheck disable=SC2086  # make_args holds two options and their values
      "$PY" "$REPO/tools/make_model.py" ${make_args[$file]} --seed 1 "${extra[@]}" --out "$file.part" \
        >"$out/make_model.${file##*/}.log" 2>&1 && mv "$file.part" "$file" &
      pids+=($!)
    done
    local pid bad=0
    for pid in "${pids[@]}"; do wait "$pid" || bad=1; done
    [ $bad = 0 ] || fail "make_model.py failed (logs: $out/make_model.*.log)"
    say "made ${#make_args[@]} model files in $((SECONDS - t0)) s"
  fi
  for file in "${!quantize_from[@]}"; do
    say "quantizing ${quantize_from[$file]} to ${file##*/}"
    qt=${file%$suffix.gguf}
    qt=${qt##*-}
    local requant=()
    [[ "${quantize_from[$file]}" == *-f16$suffix.gguf ]] || requant=(--allow-requantize)
    "$quantize" "${requant[@]}" "${quantize_from[$file]}" "$file.part" "${qt^^}" >"$out/quantize.${file##*/}.log" 2>&1 \
      || fail "llama-quantize failed (log: $out/quantize.${file##*/}.log)"
    mv "$file.part" "$file"
  done

  local failed=()
  bench_run() {  # LOG_STEM COMMAND...: JSON to LOG_STEM.json, stderr to LOG_STEM.err; a failure is noted, not fatal
    local stem=$1
    shift
    if ! "$@" >"$stem.json" 2>"$stem.err"; then
      tail -5 "$stem.err" >&2
      say "failed: $* (log: $stem.err)"
      rm -f "$stem.json"
      failed+=("${stem##*/}")
    fi
  }

  if [ "$vulkan" != - ]; then  # its first use compiles the shaders: once per file, untimed
    say "warming up llama.cpp Vulkan"
    local seen=" "
    for id in "${!file_of[@]}"; do
      file=${file_of[$id]}
      [[ "$seen" == *" $file "* ]] && continue
      seen+="$file "
      bench_run "$out/warmup-vulkan.${file##*/}" "$vulkan/llama-bench" -m "$file" -ngl 99 -fa 1 -p "$p" -n 16 -r 1 \
        -o json
    done
  fi

  local rows=() d
  for row in "${table_rows[@]}"; do
    IFS='|' read -r id label shape type at <<<"$row"
    file=${file_of[$id]}
    d=0
    [ "$at" = 1 ] && d=$depth
    rows+=("$id=${label//DEPTH/$depth}")
    rm -f "$out/$id".*.json
    say "$id (${file##*/}, depth $d): wgllm bench"
    bench_run "$out/$id.wgllm" "$wgllm" bench -m "$file" -p "$p" -n "$n" -r "$r" -d "$d" --json
    say "$id: wgllm bench ${SAMPLING[*]}"
    bench_run "$out/$id.wgllm-sampled" "$wgllm" bench -m "$file" -p 0 -n "$n" -r "$r" -d "$d" "${SAMPLING[@]}" --json
    if [ "$cuda" != - ]; then
      say "$id: llama-bench CUDA"
      bench_run "$out/$id.cuda" "$cuda/llama-bench" -m "$file" -ngl 99 -fa 1 -p "$p" -n "$n" -r "$r" -d "$d" -o json
    fi
    if [ "$vulkan" != - ]; then
      say "$id: llama-bench Vulkan"
      bench_run "$out/$id.vulkan" "$vulkan/llama-bench" -m "$file" -ngl 99 -fa 1 -p "$p" -n "$n" -r "$r" -d "$d" -o json
    fi
  done

  {
    echo "wgllm bench -p $p -n $n -r $r beside llama-bench -ngl 99 -fa 1 -p $p -n $n -r $r (tok/s, medians)"
    echo
    "${REPORT[@]}" table "$out" "$p" "$n" --sampling "${SAMPLING[*]}" "${rows[@]}"
  } | tee "$out/table.md"
  say "JSON and logs: $out"
  [ ${#failed[@]} -eq 0 ] || fail "some runs failed: ${failed[*]}"
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
  local out
  out=$(out_dir)
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
    "${REPORT[@]}" compare "$out/$stem.llama.json" "$out/$stem.wgllm.json" "$stem"
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
  local out
  out=$(out_dir)
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
    "${REPORT[@]}" batched "$out/$stem.batched.jsonl" "$out/$stem.wgllm-parallel.json" "$stem" "$p" "$n"
  done
}

usage="usage: $0 prepare-source SDIST OUT_TAR_XZ | prepare-vulkan-debs DIR | pack BUILD_DIR DIR | unpack-debs DIR PREFIX
       | build-cuda SRC_TARBALL BUILD_DIR | build-vulkan SRC_TARBALL VK_PREFIX BUILD_DIR
       | table WGLLM CUDA_BIN_DIR VULKAN_BIN_DIR [-r N] [-p N] [-n N] [-d N] [--vk-prefix DIR] [--models-dir DIR]
         [--tiny]
       | compare WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] MODEL...
       | batched WGLLM LLAMA_BIN_DIR [-p N] [-n N] [-r N] [--npl LIST] MODEL...  (see the top of this script)"
cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  prepare-source) [ $# -eq 2 ] || fail "$usage"; prepare_source "$@" ;;
  prepare-vulkan-debs) [ $# -eq 1 ] || fail "$usage"; prepare_vulkan_debs "$@" ;;
  pack) [ $# -eq 2 ] || fail "$usage"; pack "$@" ;;
  unpack-debs) [ $# -eq 2 ] || fail "$usage"; unpack_debs "$@" ;;
  build-cuda) [ $# -eq 2 ] || fail "$usage"; build_cuda "$@" ;;
  build-vulkan) [ $# -eq 3 ] || fail "$usage"; build_vulkan "$@" ;;
  table) [ $# -ge 3 ] || fail "$usage"; table "$@" ;;
  compare) [ $# -ge 3 ] || fail "$usage"; compare "$@" ;;
  batched) [ $# -ge 3 ] || fail "$usage"; batched "$@" ;;
  *) fail "$usage" ;;
esac
