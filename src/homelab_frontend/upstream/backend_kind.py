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


# -- the relayed endpoints (surfaces/media/): where each kind serves them, and its quirks ------
#
# Paths are from the server's root (the backend's url without its /v1). OpenAI's paths are
# every kind's default; a kind lists only where it differs, None where it has no such endpoint.
# A backend's own `paths` (config) wins over both: whisper.cpp's `--inference-path`.
#
# Rerank documents go to every kind as strings, the one form every reranker takes: vLLM's
#   pydantic model refuses Jina's and Cohere v1's `{text}` objects with a 400 (it takes strings or
#   `{content: [parts]}`), llama.cpp's `json_value(body, "documents", vector<string>)` reads an
#   array of them as none ("documents must be a non-empty string array").
# llama.cpp (`--reranking`): ignores `return_documents`
#   (its Jina answer has only `index` and `relevance_score`), has no /v2/rerank (Cohere v2's
#   request is v1's: the same endpoint serves it) and no /score.
# whisper.cpp's server: one endpoint, /inference, for transcription and translation (a form
#   field `translate=true`); no /v1/models: its health is GET /health.

OPENAI_PATHS = {
    "rerank": "/v1/rerank", "rerank_v2": "/v2/rerank", "score": "/v1/score",
    "transcriptions": "/v1/audio/transcriptions", "translations": "/v1/audio/translations",
    "speech": "/v1/audio/speech", "voices": "/v1/audio/voices", "audio_models": "/v1/audio/models",
    "image_generations": "/v1/images/generations", "image_edits": "/v1/images/edits",
}
_KIND_PATHS: dict[str, dict[str, str | None]] = {
    "llamacpp": {"rerank_v2": "/v1/rerank", "score": None},
    "whispercpp": {**{k: None for k in OPENAI_PATHS}, "transcriptions": "/inference", "translations": "/inference"},
}
_HEALTH_PATHS = {"whispercpp": "/health"}


def media_path(cfg: Backend, endpoint: str) -> str | None:
    """The backend's path (from its root) for a relayed endpoint; None: it has none."""
    own = cfg.paths.get(endpoint)
    if own is not None:
        return own
    kind = _KIND_PATHS.get(cfg.kind or "")
    if kind is not None and endpoint in kind:
        return kind[endpoint]
    return OPENAI_PATHS[endpoint]


def health_path(cfg: Backend) -> str | None:
    """The path (from the server's root) whose 200 says the backend is up, for a server
    without GET /v1/models; None: /v1/models is its health."""
    return cfg.health_path or _HEALTH_PATHS.get(cfg.kind or "")


def rerank_body(cfg: Backend, doc: dict) -> dict:
    """A rerank request as the backends take it: `{text}` documents as their strings; for
    llama.cpp a `top_n` of 0 left out (vLLM reads 0 as "all"; llama.cpp would cut the results to
    none)."""
    if isinstance(doc.get("documents"), list) and any(isinstance(d, dict) for d in doc["documents"]):
        docs = [d.get("text") if isinstance(d, dict) and isinstance(d.get("text"), str) else d
                for d in doc["documents"]]
        doc = {**doc, "documents": docs}
    if cfg.kind == "llamacpp" and doc.get("top_n") == 0:
        doc = {k: v for k, v in doc.items() if k != "top_n"}
    return doc


def rerank_answer(cfg: Backend, request: dict, answer: dict) -> dict:
    """A rerank answer completed where the kind leaves out what was asked: llama.cpp's has no
    `document` even when `return_documents` is true, so it is put back from the request."""
    if cfg.kind != "llamacpp" or request.get("return_documents") is not True:
        return answer
    docs, results = request.get("documents"), answer.get("results")
    if not isinstance(docs, list) or not isinstance(results, list):
        return answer
    out = []
    for r in results:
        i = r.get("index") if isinstance(r, dict) else None
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(docs) and "document" not in r:
            d = docs[i]
            r = {**r, "document": d if isinstance(d, dict) else {"text": d}}
        out.append(r)
    return {**answer, "results": out}


def form_extras(cfg: Backend, endpoint: str) -> dict[str, str]:
    """Form fields the kind needs added to a relayed upload (whisper.cpp: `translate`)."""
    if cfg.kind == "whispercpp" and endpoint == "translations":
        return {"translate": "true"}
    return {}
