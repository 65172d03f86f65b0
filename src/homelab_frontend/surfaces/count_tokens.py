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
from ..upstream.prompt_count import count_prompt
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
    count = await count_prompt(gw.clients[backend.name], backend.cfg.kind, chat)
    if count is None:
        count = max(1, len(msgspec.json.encode(chat["messages"])) // _BYTES_PER_TOKEN)
    t.tokens_in = count
    return count
