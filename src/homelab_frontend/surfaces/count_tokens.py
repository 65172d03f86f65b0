"""A prompt's size in tokens, for the dialects that let a client ask before sending it (Anthropic's
/messages/count_tokens, Gemini's countTokens): read, parse, route and let in by the key like a
request, then counted without a slot, since nothing is generated.

The count is the backend's own (vLLM, llama.cpp: chat template and tools included,
upstream/prompt_count.py); a backend with no tokenizer endpoint gets an estimate, about four
bytes of chat text per token. Either way it is the request record's `tokens_in`.
"""

from __future__ import annotations

from typing import Callable

import msgspec
from aiohttp import web

from .. import canonical as c
from ..request.tracker import Tracked
from ..upstream.chat_body import build_body
from ..errors import GatewayError
from ..request.outcome import DONE
from ..upstream.prompt_count import count_prompt
from .body import decode_object
from .context import Gateway

_BYTES_PER_TOKEN = 4


async def prompt_tokens(request: web.Request, gw: Gateway, t: Tracked, dialect: str,
                        parse: Callable[[bytes], c.Request]) -> int:
    """The prompt's token count; `dialect` is the key scope `auth.admit` checks."""
    body = await gw.read_body(request)
    req = await gw.parse(body, parse)
    t.model = req.model
    route = gw.router.resolve(req.model)
    gw.auth.admit(request, route, dialect)
    backend = route.choose()
    t.backend = backend.name
    chat = msgspec.json.decode(build_body(req, upstream_model=route.upstream_model, backend=backend.cfg,
                                          stream=False, max_tokens=None, system_turns=route.system_turns))
    kind = backend.cfg.kind  # None: not yet probed, no tokenizer known (what count_prompt says of it)
    count = await count_prompt(gw.clients[backend.name], kind, chat) if kind is not None else None
    if count is None:
        count = max(1, len(msgspec.json.encode(chat["messages"])) // _BYTES_PER_TOKEN)
    t.tokens_in = count
    return count


async def tokenize(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """`POST /llm/v1/tokenize` (vLLM's shape: `{model, messages, tools?, chat_template_kwargs?}` ->
    `{"count": n}`, null when the backend has no tokenizer): what a front gateway asks of this one
    as its peer (upstream/prompt_count.py), counted by the tokenizer of the backend the front
    holds a slot of (`x-hlf-peer-backend` from a peer key), else of the model's usual backend."""
    raw = await gw.parse(await gw.read_body(request), decode_object)
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError("invalid_request", "model: required string field is missing", param="model")
    if not isinstance(raw.get("messages"), list):
        raise GatewayError("invalid_request", "messages: required array field is missing", param="messages")
    t.model = model
    route = gw.router.resolve(model)
    principal = gw.auth.admit(request, route, "openai")
    backend = next((b for b in route.backends if b.name == principal.pin and b.up), None) or route.choose()
    t.backend = backend.name
    chat = {k: raw[k] for k in ("messages", "tools", "chat_template_kwargs") if k in raw}
    kind = backend.cfg.kind
    count = (await count_prompt(gw.clients[backend.name], kind, {"model": route.upstream_model, **chat})
             if kind is not None else None)
    t.end(DONE, override=True)
    return web.Response(body=msgspec.json.encode({"count": count}), content_type="application/json",
                        headers=gw.headers(t))
