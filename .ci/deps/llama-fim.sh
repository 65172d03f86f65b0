#!/usr/bin/env bash
# A fill-in-the-middle copy of the Gemma 3 270M GGUF (from llama-cpp.sh, which runs before this),
# so llama.cpp's real llama-server answers `/infill` in tests/real/ (the editors' requests:
# llama.vim, llama.vscode). Gemma 3 names no FIM tokens, and llama.cpp refuses /infill without
# them (501); this copy's metadata names six of Gemma's unused tokens (<unused2> .. <unused7>,
# ids 8 to 13) as fim_pre, fim_suf, fim_mid, fim_pad, fim_rep and fim_sep. The weights are the
# same bytes: the model was never trained on those tokens, so what it writes is no real
# completion, but every request and answer takes the path a FIM model's does (the repo-level
# fim_rep / fim_sep form of `input_extra` included).
# Made with `gguf_new_metadata` of llama.cpp's gguf-py (the `gguf` package on PyPI), installed in
# a temporary directory; the result is cached beside the base model, so a second run takes no time.
set -euo pipefail
GGUF_VERSION=0.19.0
HOME_DIR="${HLF_LLAMA_HOME:-$HOME/.cache/homelab-frontend/llama.cpp}"
BASE="$HOME_DIR/models/gemma-3-270m-q4_k_m.gguf"
FIM="$HOME_DIR/models/gemma-3-270m-fim-q4_k_m.gguf"
PY="${PYTHON:-python3}"

if [ -s "$FIM" ]; then
  echo "llama-fim.sh: FIM model already at $FIM"
  exit 0
fi
if [ ! -s "$BASE" ]; then
  echo "llama-fim.sh: no base model at $BASE: run .ci/deps/llama-cpp.sh first" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip install -q --target "$work/py" "gguf==$GGUF_VERSION"
PYTHONPATH="$work/py" "$PY" -m gguf.scripts.gguf_new_metadata "$BASE" "$work/fim.gguf" --force \
  --special-token-by-id fim_pre 8 --special-token-by-id fim_suf 9 --special-token-by-id fim_mid 10 \
  --special-token-by-id fim_pad 11 --special-token-by-id fim_rep 12 --special-token-by-id fim_sep 13 \
  >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
mv "$work/fim.gguf" "$FIM.tmp"
mv "$FIM.tmp" "$FIM"
echo "llama-fim.sh: FIM model at $FIM"
