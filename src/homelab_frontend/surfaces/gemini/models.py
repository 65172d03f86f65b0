"""Models, token counts and embedding requests in Google's shapes (the answer's vectors are
surfaces/embeddings.py's, shared with the other dialects). Pure.

A model is `models/<name>` where <name> is what the client asked for (a configured model in the
list; for `models.get`, the client's name, which may be an alias such as `gemini-2.5-flash`).
`inputTokenLimit` and `outputTokenLimit` are the model's context length when the gateway knows
it (config `max_model_len`, or what the backend reported), else left out: the backend decides
how much of the context an answer may take. `thinking` is whether the model reasons, from its
card's capabilities (surfaces/model_card.py); without a card, true: every model accepts a
`thinkingConfig` (the backend's template decides whether the model reasons). An embedding model
(`embedding` without `completion`) lists only the embedding methods; a media model (rerank, speech,
transcription, image: no `completion`) none, since Gemini's methods are not how it is called. Nothing outside Google's
`Model` fields is added: the GenAI SDKs parse the entry strictly.
"""

from __future__ import annotations

from typing import Any

from ...config import MEDIA_CAPABILITIES as MEDIA
from ...errors import GatewayError
from ..fields import as_list as _list, as_obj as _obj, invalid as _invalid
from .fields import get as _get

GENERATION_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]
EMBEDDING_METHODS = ["embedContent", "batchEmbedContents"]


def model_entry(name: str, model: str, context_length: int | None,
                capabilities: tuple[str, ...] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": f"models/{name}",
        "version": "homelab",
        "displayName": name if name == model else f"{name} ({model})",
        "description": f"{model}, served by homelab-frontend",
    }
    if context_length:
        entry["inputTokenLimit"] = context_length
        entry["outputTokenLimit"] = context_length
    caps = capabilities
    embeds_only = caps is not None and "embedding" in caps and "completion" not in caps
    media_only = caps is not None and "completion" not in caps and any(c in MEDIA for c in caps)
    if media_only and caps is not None:  # media_only implies caps; said again for the checker
        entry["supportedGenerationMethods"] = EMBEDDING_METHODS if "embedding" in caps else []
    else:
        entry["supportedGenerationMethods"] = (EMBEDDING_METHODS if embeds_only
                                               else GENERATION_METHODS + EMBEDDING_METHODS)
    entry["thinking"] = True if caps is None else "thinking" in caps
    return entry


def model_name(path_name: str) -> str:
    """The model named in a URL path (`gemini-2.5-flash`, or `models/gemini-2.5-flash` when a
    client doubles the prefix); an empty one is a 404."""
    name = path_name[len("models/"):] if path_name.startswith("models/") else path_name
    if not name:
        raise GatewayError("not_found", f"model {path_name!r} not found", param="model")
    return name


def count_request(raw: dict) -> dict:
    """The GenerateContentRequest a countTokens body means: `{contents, ...}` or
    `{generateContentRequest: {...}}` (the API's two forms)."""
    inner = _get(raw, "generateContentRequest")
    if inner is not None:
        return _obj(inner, "generateContentRequest")
    return raw


def embed_inputs(raw: dict, batch: bool) -> list[str]:
    """The texts of an embedContent body (`content`) or a batchEmbedContents body (`requests`,
    each with its `content`); a part that is not text is a 400 (no upstream embeds images here)."""
    if not batch:
        return [_content_text(_get(raw, "content"), "content")]
    requests = _get(raw, "requests")
    if requests is None:
        raise _invalid("requests", "required field is missing")
    out = []
    for i, r in enumerate(_list(requests, "requests")):
        out.append(_content_text(_get(_obj(r, f"requests[{i}]"), "content"), f"requests[{i}].content"))
    if not out:
        raise _invalid("requests", "must hold at least one request")
    return out


def _content_text(content: Any, path: str) -> str:
    if content is None:
        raise _invalid(path, "required field is missing")
    parts = _get(_obj(content, path), "parts")
    texts = []
    for j, part in enumerate(_list(parts if parts is not None else [], f"{path}.parts")):
        text = _obj(part, f"{path}.parts[{j}]").get("text")
        if not isinstance(text, str):
            raise _invalid(f"{path}.parts[{j}]", "only text parts can be embedded")
        texts.append(text)
    if not texts:
        raise _invalid(f"{path}.parts", "must hold at least one text part")
    return "\n".join(texts)
