"""A chat request's prompt size in tokens, counted by the backend's own tokenizer.

The context clamp (request/context_clamp.py) and count_tokens need the number the backend itself will check
`max_tokens` against, which only its tokenizer and chat template know:
- vLLM: POST /tokenize (at the server root) with the chat body's messages, tools and
  chat_template_kwargs: the template applied as for the completion, generation prompt included.
- llama.cpp: POST /apply-template (the same chat template and tools) and POST /tokenize of the
  prompt it returns, special tokens parsed as the completion does.
- a peer box (another homelab-frontend): POST <its /llm/v1>/tokenize, which counts with the
  tokenizer of the backend the front holds a slot of (surfaces/count_tokens.py), so a count through
  two hops is the one the box alone would give.
- Ollama and other OpenAI-compatible servers have no tokenizer endpoint: None.
A tokenizer that fails, answers nonsense or takes longer than `timeout_s` also gives None: the
caller then estimates, as it would without one. Upstream bodies are read bounded.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from ..errors import GatewayError
from .client import UpstreamClient

_MAX_BODY = 16 * 1024 * 1024  # /tokenize returns every token id: 4M tokens is far past any context
_decode = msgspec.json.decode
_encode = msgspec.json.encode


async def _post_json(client: UpstreamClient, path: str, body: dict) -> object:
    resp = await client.post(path, _encode(body), root=True, side=True)
    try:
        raw = await resp.content.read(_MAX_BODY + 1)
    finally:
        resp.release()
    if len(raw) > _MAX_BODY:
        raise ValueError("tokenizer answer too large")
    return _decode(raw)


async def _vllm(client: UpstreamClient, chat: dict) -> int | None:
    body = {k: chat[k] for k in ("model", "messages", "tools", "chat_template_kwargs") if k in chat}
    doc = await _post_json(client, "/tokenize", body)
    count = doc.get("count") if isinstance(doc, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


async def _llamacpp(client: UpstreamClient, chat: dict) -> int | None:
    body = {k: chat[k] for k in ("messages", "tools", "chat_template_kwargs") if k in chat}
    doc = await _post_json(client, "/apply-template", body)
    prompt = doc.get("prompt") if isinstance(doc, dict) else None
    if not isinstance(prompt, str):
        return None
    doc = await _post_json(client, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
    tokens = doc.get("tokens") if isinstance(doc, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


async def _peer(client: UpstreamClient, chat: dict) -> int | None:
    body = {k: chat[k] for k in ("model", "messages", "tools", "chat_template_kwargs") if k in chat}
    resp = await client.post("/tokenize", _encode(body), side=True)
    try:
        raw = await resp.content.read(64 * 1024)
    finally:
        resp.release()
    doc = _decode(raw)
    count = doc.get("count") if isinstance(doc, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


_COUNTERS = {"vllm": _vllm, "llamacpp": _llamacpp, "peer": _peer}


def can_count(kind: str) -> bool:
    return kind in _COUNTERS


async def count_prompt(client: UpstreamClient, kind: str, chat: dict, timeout_s: float = 10.0) -> int | None:
    """Prompt tokens of `chat` (an OpenAI chat body, decoded) by the backend's tokenizer, or None."""
    counter = _COUNTERS.get(kind)
    if counter is None:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            return await counter(client, chat)
    except (GatewayError, msgspec.DecodeError, ValueError, aiohttp.ClientError, OSError, TimeoutError):
        return None
