"""Which server software a backend runs, when its config does not say (`kind` left out).

The kind decides wire details the gateway cannot see from one answer: vLLM reports the stop
string that fired (elsewhere the gateway matches stop strings itself), takes continuous usage
stats and `chat_template_kwargs`, and has its own leak-check metric. Told nothing, the gateway
reads it off the `/v1/models` probe, where each server leaves a distinctive mark:

| server    | mark in GET /v1/models                                                    |
|-----------|---------------------------------------------------------------------------|
| vLLM      | `owned_by: "vllm"` (and `max_model_len`)                                  |
| llama.cpp | `owned_by: "llamacpp"`, `meta.n_ctx`, a top-level `models` list           |
| Ollama    | `owned_by: "library"` (or the model's namespace) with `name:tag` ids      |
| a peer    | `owned_by: "homelab-frontend"` and a `homelab` block (upstream/peer.py)   |

Anything else is `openai`: a plain OpenAI-compatible server, given nothing but the standard
fields. An explicit `kind` in the config always wins; until the first probe answers, a backend
without one is treated as vLLM (the default before detection existed).
"""

from __future__ import annotations

import msgspec

from ..config import Backend
from .peer import is_peer_list

DEFAULT = "vllm"


def detect(doc: object) -> str | None:
    """The kind a `/v1/models` answer reveals, or None when it is no model list at all."""
    if not isinstance(doc, dict):
        return None
    data = doc.get("data")
    if not isinstance(data, list):
        return None
    if is_peer_list(doc):  # before vLLM: a gateway's list carries max_model_len too
        return "peer"
    models = [m for m in data if isinstance(m, dict)]
    owners = {m.get("owned_by") for m in models}
    if "vllm" in owners or any(isinstance(m.get("max_model_len"), int) for m in models):
        return "vllm"
    if "llamacpp" in owners or any(isinstance(m.get("meta"), dict) for m in models) or (
        isinstance(doc.get("models"), list) and "llamacpp" in str(doc.get("models"))[:4096]
    ):
        return "llamacpp"
    if "library" in owners or "ollama" in owners:
        return "ollama"
    # Ollama's own models are owned by their namespace (`bob` for `bob/m:7b`), ids are name:tag
    if models and all(isinstance(m.get("id"), str) and ":" in m["id"] for m in models) and not (
        owners & {"openai", "system"}
    ):
        return "ollama"
    return "openai"


def effective(cfg: Backend, detected: str | None) -> Backend:
    """The backend's config with its kind filled in: the configured one, else the detected one."""
    if cfg.kind is not None:
        return cfg
    return msgspec.structs.replace(cfg, kind=detected or DEFAULT)  # type: ignore[arg-type]
