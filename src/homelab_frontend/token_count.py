"""A real prompt-token count from the backend's own tokenizer, for count_tokens.

vLLM: `POST /tokenize` with the chat messages (and tools) renders its chat template and counts.
llama.cpp: `POST /apply-template` renders the prompt exactly as a chat request would, then
`POST /tokenize` (with the special tokens parsed and BOS added, as a completion does) counts it:
the figure equals the `prompt_tokens` of the same request. Others (Ollama, plain OpenAI) have no
tokenizer endpoint: None, and the caller estimates. A tokenizer that answers badly counts as none.
"""

from __future__ import annotations

import aiohttp
import msgspec

from .errors import GatewayError
from .upstream import UpstreamClient


async def _post_json(client: UpstreamClient, path: str, body: dict) -> object:
    resp = await client.post(path, root=True, body=msgspec.json.encode(body))
    try:
        return msgspec.json.decode(await resp.read())
    finally:
        resp.release()


async def count(client: UpstreamClient, kind: str | None, chat: dict) -> int | None:
    """Prompt tokens of `chat` (an upstream chat-completions body) per the backend, or None."""
    try:
        if kind == "vllm":
            body = {"model": chat["model"], "messages": chat["messages"]}
            if "tools" in chat:
                body["tools"] = chat["tools"]
            doc = await _post_json(client, "/tokenize", body)
            if isinstance(doc, dict) and isinstance(doc.get("count"), int):
                return doc["count"]
        elif kind == "llamacpp":
            body = {"messages": chat["messages"]}
            if "tools" in chat:
                body["tools"] = chat["tools"]
            rendered = await _post_json(client, "/apply-template", body)
            if not (isinstance(rendered, dict) and isinstance(rendered.get("prompt"), str)):
                return None
            doc = await _post_json(client, "/tokenize", {"content": rendered["prompt"], "add_special": True,
                                                         "parse_special": True})
            if isinstance(doc, dict) and isinstance(doc.get("tokens"), list):
                return len(doc["tokens"])
    except (GatewayError, msgspec.DecodeError, aiohttp.ClientError, OSError):
        return None
    return None
