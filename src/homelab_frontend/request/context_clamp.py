"""Opening an upstream chat completion for a canonical request: body, context clamp, retry.

Claude Code asks for `max_tokens` up to 128000 whatever the model; vLLM answers 400 when prompt +
max_tokens exceeds its context. The gateway clamps to the model's context length (config, or the
backend's /v1/models `max_model_len`) less the prompt, right the first time:
- when even a high estimate of the prompt (one token per 2 bytes of body, images left out) leaves
  room for `max_tokens`, nothing is clamped and nothing is counted;
- otherwise a backend with a tokenizer endpoint (vLLM, llama.cpp: upstream/prompt_count.py) counts the
  prompt exactly, and `max_tokens` becomes at most the context less that count;
- without one (or when it fails), the clamp uses a low estimate (one token per 8 bytes), so it
  never takes away room the model really has.
When vLLM still refuses and says how long the prompt is, the gateway retries once with exactly
what fits, before a single byte has gone to the client. Each clamp and retry is counted
(`hlf_context_clamps_total{how="tokenizer"|"estimate"|"retry"}`), so a retry on every turn shows.

`count_prompt=True` (a surface that must say the prompt's size before or without the upstream's
usage: Anthropic's message_start, a gateway-side stop) starts the exchange's prompt count
(request/exchange.py) beside the upstream call; the clamp then waits for that same count instead of
asking the tokenizer twice. vLLM asked for continuous usage reports the prompt on its first chunk,
so it is not counted again there: its API server tokenizes on the loop that also starts the
generation, and a second tokenization would be paid in time to first token.
"""

from __future__ import annotations

import re

import aiohttp
from .. import canonical as c
from ..errors import GatewayError
from .exchange import Exchange
from ..upstream.chat_body import build_body

# The wordings vLLM has used for the same refusal; 0.32's counts a prompt it truncated at one token
# past the context ("at least 1025"), which is all the gateway needs: there is no room.
_CTX_OLD = re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages", re.S)
_CTX_NEW = re.compile(r"maximum context length is (\d+) tokens.*?has (\d+) input tokens", re.S)
_CTX_032 = re.compile(r"maximum context length is (\d+) tokens.*?prompt contains (?:at least )?(\d+) input tokens",
                      re.S)
# llama.cpp's exceed_context_size_error (also for stream: true); it refuses only a prompt that
# alone exceeds a slot's context, and cuts an answer short at the context's end instead.
_CTX_LLAMA = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")


def context_refusal(message: str) -> tuple[int, int] | None:
    """(context length, prompt tokens) from a vLLM or llama.cpp context-length 400, if that is
    what it is."""
    for pattern in (_CTX_OLD, _CTX_NEW, _CTX_032):
        m = pattern.search(message)
        if m:
            return int(m.group(1)), int(m.group(2))
    m = _CTX_LLAMA.search(message)
    if m:
        return int(m.group(2)), int(m.group(1))
    return None


def _image_bytes(req: c.Request) -> int:
    """Bytes of image URLs in the upstream body (tool messages carry no images upstream)."""
    return sum(
        len(p.url) for m in req.messages if m.role != "tool" for p in m.parts if isinstance(p, c.ImagePart)
    )


async def open_chat(
    ex: Exchange,
    req: c.Request,
    *,
    stream: bool,
    continuous_usage: bool = False,
    send_stop: bool = True,
    count_prompt: bool = False,
) -> aiohttp.ClientResponse:
    """The upstream chat for `req` on the exchange's backend, or, when that one fails before
    answering, on another of the model's (Exchange.attempt: the body and the clamp are the
    backend's own, so they are made again there)."""
    return await ex.attempt(lambda: _open_chat(ex, req, stream, continuous_usage, send_stop, count_prompt))


async def _open_chat(
    ex: Exchange, req: c.Request, stream: bool, continuous_usage: bool, send_stop: bool, count_prompt: bool
) -> aiohttp.ClientResponse:
    assert ex.backend is not None
    backend = ex.backend
    ctx = ex.route.context_length(backend)
    max_tokens = req.max_tokens

    def body(mt: int | None) -> bytes:
        return build_body(
            req,
            upstream_model=ex.route.upstream_model,
            backend=backend.cfg,
            stream=stream,
            max_tokens=mt,
            send_stop=send_stop,
            continuous_usage=continuous_usage,
            system_turns=ex.route.system_turns,
        )

    payload = body(max_tokens)
    if count_prompt and not (continuous_usage and backend.cfg.kind == "vllm"):
        ex.count_prompt(payload)
    if ctx is not None and max_tokens is not None and max_tokens > ctx - len(payload) // 2:
        # Image data is not prompt text (a vision model spends a few hundred tokens on an
        # image): counted as text, one 80 kB screenshot would clamp the answer to one token.
        text_bytes = len(payload) - _image_bytes(req)
        if max_tokens > ctx - text_bytes // 2:  # even a high estimate may not leave the room
            prompt = None
            if ex.count_prompt(payload):  # the count already running, or one started now
                ex.t.connecting()  # the slot is held; a client leaving now left while connecting
                prompt = await ex.counted_prompt()
            if prompt is not None:
                ex.t.clamp = "tokenizer"
                if prompt >= ctx:
                    raise _no_room(ex, prompt, ctx)
                room = ctx - prompt
            else:
                # A prompt is rarely under one token per 8 bytes of JSON: a low estimate, so
                # the clamp never takes away room the model really has; the retry covers the rest.
                ex.t.clamp = "estimate"
                room = max(1, ctx - text_bytes // 8)
            if max_tokens > room:
                max_tokens = room
                payload = body(max_tokens)
    try:
        return await ex.open("/chat/completions", payload, stream=stream)
    except GatewayError as err:
        if err.status != 400 or max_tokens is None:
            raise
        refusal = context_refusal(err.message)
        if refusal is None:
            raise
        length, prompt = refusal
        fits = length - prompt
        if fits < 1:
            raise _no_room(ex, prompt, length) from None
        if fits >= max_tokens:
            raise
        ex.t.clamp = "retry"
        return await ex.open("/chat/completions", body(fits), stream=stream)


def _no_room(ex: Exchange, prompt: int, length: int) -> GatewayError:
    return GatewayError(
        "invalid_request",
        f"the prompt is {prompt} tokens, and model {ex.route.client_model!r} "
        f"has a context of {length} tokens: no room left to answer",
        param="messages",
    )
