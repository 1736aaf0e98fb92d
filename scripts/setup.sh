#!/usr/bin/env bash
# Installs everything wgllm needs on Debian 12 and builds it.  Idempotent: safe to rerun.
#   scripts/setup.sh            install dependencies + configure + build (Release)
#   WGLLM_SKIP_APT=1 ...        skip the Debian packages (already installed)
#   WGLLM_BUILD_TYPE=Debug ...  build type
#   WGLLM_TEST_PACKAGES=1 ...   also what only the tests need (Chromium for the chat page test; scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

say()  { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || fail "not root and no sudo: run as root or install sudo"
  SUDO="sudo"
fi

# ---------------------------------------------------------------- Debian packages
PKGS=(build-essential cmake pkg-config python3 python3-venv python3-pip unzip ca-certificates
      libvulkan1 vulkan-tools libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev
      libutf8proc-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
      libvulkan-dev  # the Vulkan headers of the shader-statistics layer (scripts/shader_stats.py)
      clang libclang-rt-14-dev)  # clang + libFuzzer: the fuzz targets (CTest test `fuzz`)
# Only for the tests (scripts/test.sh sets WGLLM_TEST_PACKAGES=1): headless Chromium and its WebDriver for the chat
# page's browser test (CTest test `server_browser`).
if [ "${WGLLM_TEST_PACKAGES:-0}" = 1 ]; then PKGS+=(chromium chromium-driver); fi

if [ "${WGLLM_SKIP_APT:-0}" != 1 ]; then
  # lavapipe from bookworm-backports (Mesa 25): Debian 12's own Mesa 22.3 is too old.
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # The first non-security Debian mirror named in the sources (one-line or deb822 format).
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
             | sed -e 's/#.*//' | grep -oE '(^deb |^URIs:).*' | grep -oE 'https?://[^ ]+' \
             | grep -v -e security -e '^$' | grep -E '/debian/?$' | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    say "adding bookworm-backports from ${mirror}"
    echo "deb ${mirror%/} bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/wgllm-backports.list >/dev/null
  fi
  export DEBIAN_FRONTEND=noninteractive
  say "apt-get update"
  $SUDO apt-get update -qq || fail "apt-get update failed (network or mirror?)"
  missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing: ${missing[*]}"
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || fail "apt-get install failed for: ${missing[*]}"
  fi
  mesa_ver=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
  case "$mesa_ver" in
    25*|26*|27*) ;;
    *) say "installing mesa-vulkan-drivers (lavapipe) from bookworm-backports"
       $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports mesa-vulkan-drivers >/dev/null \
         || fail "could not install mesa-vulkan-drivers from bookworm-backports" ;;
  esac
fi

# ---------------------------------------------------------------- wgpu-native
# wgpu-native 29.0.1.1, taken from the PyPI wheel wgpu==0.32.0 (shared library + webgpu.h/wgpu.h).
WGPU_DIR="$ROOT/third_party/wgpu-native"
WGPU_WHEEL=wgpu-0.32.0-py3-none-manylinux_2_28_x86_64.whl
WGPU_SHA256=6499a31b5a29a10b4f1089fea4a0806411f42605fa86b6c0b543a07ca0de8568
if [ ! -f "$WGPU_DIR/.ok" ]; then
  tmp=$(mktemp -d)
  say "downloading wgpu==0.32.0 wheel from PyPI"
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 -d "$tmp" wgpu==0.32.0 || fail "pip download wgpu==0.32.0 failed"
  whl=$(ls "$tmp"/wgpu-0.32.0-*.whl | head -n1)
  got=$(sha256sum "$whl" | cut -d' ' -f1)
  [ "$got" = "$WGPU_SHA256" ] || fail "sha256 mismatch for $(basename "$whl"): got $got, want $WGPU_SHA256"
  rm -rf "$WGPU_DIR"; mkdir -p "$WGPU_DIR/include/webgpu" "$WGPU_DIR/lib"
  unzip -q -o "$whl" 'wgpu/resources/*' -d "$tmp/x" || fail "could not unpack $whl"
  cp "$tmp"/x/wgpu/resources/*.so "$WGPU_DIR/lib/libwgpu_native.so"
  cp "$tmp"/x/wgpu/resources/webgpu.h "$tmp"/x/wgpu/resources/wgpu.h "$WGPU_DIR/include/webgpu/"
  touch "$WGPU_DIR/.ok"; rm -rf "$tmp"
  say "wgpu-native unpacked into third_party/wgpu-native"
fi

# ---------------------------------------------------------------- Python tooling (tools/)
# gguf / numpy / tokenizers / sentencepiece make the test models and reference token ids; openai / requests /
# selenium drive `wgllm serve` in tests/server/ and scripts/load_test.py; jinja2 renders the chat templates wgllm's
# own interpreter is compared with (tests/jinja/).
VENV="$ROOT/.venv"
PY_PKGS=(gguf==0.19.0 numpy==2.3.5 tokenizers==0.23.2 sentencepiece==0.2.1
         openai==3.57.0 requests==2.34.2 selenium==4.51.0 jinja2==3.1.6)
if [ "${WGLLM_SKIP_VENV:-0}" != 1 ]; then
  stamp="$VENV/.wgllm-$(echo "${PY_PKGS[*]}" | sha256sum | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    say "creating the Python venv for tools/ (${PY_PKGS[*]})"
    python3 -m venv "$VENV" || fail "python3 -m venv failed (install python3-venv)"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}" || fail "pip install ${PY_PKGS[*]} failed"
    touch "$stamp"
  fi
fi

# ---------------------------------------------------------------- build
BUILD_DIR=${WGLLM_BUILD_DIR:-"$ROOT/build"}
say "configuring ${BUILD_DIR} (${WGLLM_BUILD_TYPE:-Release})"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${WGLLM_BUILD_TYPE:-Release}" ${WGLLM_CMAKE_ARGS:-} >/dev/null \
  || fail "cmake configure failed"
say "building (this takes a few minutes on 2 cores)"
cmake --build "$BUILD_DIR" -j"$(nproc)" || fail "build failed"
say "done: ${BUILD_DIR}/bin/wgllm"
