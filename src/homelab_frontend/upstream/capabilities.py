"""What a backend says its model can do: the source of truth for Ollama's `/api/show`.

A vLLM `/v1/models` says nothing of tools, thinking, vision or embeddings, so the capabilities
come only from backends that tell:
- Ollama: `POST /api/show {"model"}` at the server root: its own `capabilities` list,
  `model_info`, `details`, `template`, `parameters`, passed on as Ollama gave them;
- llama.cpp: `GET /props` at the root (tools/server/server-context.cpp): `completion` (a chat
  server); its chat template's capabilities (`chat_template_caps`, common/jinja/caps.cpp):
  `supports_tool_calls` -> tools (the template renders the model's calls, what llama.cpp's tool
  parser needs; servers older than that key: `supports_tools`), `supports_reasoning_effort` or
  `supports_preserve_reasoning` (the template reads an effort, or renders earlier reasoning: a
  reasoning model's template) -> thinking; `modalities.vision` / `.audio` -> vision / audio;
- any other kind: nothing (None), and the caller falls back on the model's `capabilities:` list
  in the config. Nothing is ever guessed from a model's name.
A backend that fails, answers nonsense or is slow gives None as well. `parse_*` are pure.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from ..config import MODEL_CAPABILITIES as KNOWN  # noqa: F401  (the vocabulary of capabilities)
from ..errors import GatewayError
from .client import UpstreamClient

__all__ = ["Facts", "fetch_facts", "parse_llamacpp_props", "parse_ollama_show"]

_MAX_BODY = 4 * 1024 * 1024


class Facts(msgspec.Struct, frozen=True):
    """A backend's own account of one of its models (empty fields: it did not say)."""

    capabilities: tuple[str, ...]
    model_info: dict = msgspec.field(default_factory=dict)
    details: dict = msgspec.field(default_factory=dict)
    template: str | None = None
    parameters: str | None = None
    context_length: int | None = None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def parse_ollama_show(doc: object) -> Facts | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("capabilities"), list):
        return None
    caps = tuple(c for c in doc["capabilities"] if isinstance(c, str) and c)
    raw_info = doc.get("model_info")
    info: dict = raw_info if isinstance(raw_info, dict) else {}
    arch = info.get("general.architecture")
    ctx = _int(info.get(f"{arch}.context_length")) if isinstance(arch, str) else None
    return Facts(
        capabilities=caps,
        model_info=info,
        details=doc["details"] if isinstance(doc.get("details"), dict) else {},
        template=doc["template"] if isinstance(doc.get("template"), str) else None,
        parameters=doc["parameters"] if isinstance(doc.get("parameters"), str) else None,
        context_length=ctx,
    )


def parse_llamacpp_props(doc: object) -> Facts | None:
    if not isinstance(doc, dict):
        return None
    tcaps = doc.get("chat_template_caps")
    tcaps = tcaps if isinstance(tcaps, dict) else {}
    modalities = doc.get("modalities")
    modalities = modalities if isinstance(modalities, dict) else {}
    caps = ["completion"]
    calls = tcaps.get("supports_tool_calls")
    if calls is True or (calls is None and tcaps.get("supports_tools") is True):
        caps.append("tools")
    if tcaps.get("supports_reasoning_effort") is True or tcaps.get("supports_preserve_reasoning") is True:
        caps.append("thinking")
    if modalities.get("vision") is True:
        caps.append("vision")
    if modalities.get("audio") is True:
        caps.append("audio")
    settings = doc.get("default_generation_settings")
    ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return Facts(capabilities=tuple(caps), context_length=ctx)


async def _ollama(client: UpstreamClient, model: str) -> Facts | None:
    resp = await client.post("/api/show", msgspec.json.encode({"model": model}), root=True)
    try:
        raw = await resp.content.read(_MAX_BODY)
    finally:
        resp.release()
    return parse_ollama_show(msgspec.json.decode(raw))


async def _llamacpp(client: UpstreamClient, model: str) -> Facts | None:
    return parse_llamacpp_props(msgspec.json.decode(await client.get_text("/props")))


_SOURCES = {"ollama": _ollama, "llamacpp": _llamacpp}


def can_tell(kind: str | None) -> bool:
    return kind in _SOURCES


async def fetch_facts(client: UpstreamClient, kind: str | None, model: str, timeout_s: float = 5.0) -> Facts | None:
    """The backend's account of `model` (its upstream name), or None when it cannot or will not say."""
    source = _SOURCES.get(kind or "")
    if source is None:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            return await source(client, model)
    except (GatewayError, msgspec.DecodeError, ValueError, aiohttp.ClientError, OSError, TimeoutError):
        return None
