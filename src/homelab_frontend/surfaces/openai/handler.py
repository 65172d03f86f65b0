"""The OpenAI Chat Completions surface: /llm/v1/chat/completions, /models, /embeddings.

Upstreams already speak this dialect, so answers are relayed chunk by chunk with only the model
name put back to the one the client sent (model_rewrite.py). Each chunk, and each whole answer,
is first decoded and checked by the one decoder (upstream_decode): what is not a chat completion
is never relayed, but ends the request with a 502 (or an error chunk once streaming). The same
decode serves accounting: first token, usage, a mid-stream error. The gateway always asks the
upstream for usage (for its logs and metrics) and drops the usage-only chunk when the client did
not ask for it. The front half (read, parse, route, admit, exchange) is the skeleton's
(surfaces/skeleton.py); the per-chunk loop is its own, folding usage with `UsageFold.add`.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import msgspec
from aiohttp import web

from ... import canonical as c
from ...request.context_clamp import open_chat
from ...errors import GatewayError, clean_message
from ...request.exchange import Exchange, client_gone
from ...request.outcome import DONE
from ...request.tracker import Tracked
from ...upstream.decode import (
    THINK_TAG,
    ChunkMalformed,
    ErrorBody,
    Malformed,
    chunk_error,
    decode_chunk,
    strip_think,
    validate_completion,
)
from ...policy.routing import BackendState
from ...upstream.client import UpstreamClient, UpstreamFailure
from ...upstream.read import UpstreamTooLarge
from ..body import decode_object
from .. import model_card
from ..model_rewrite import ModelRewriter
from .assemble import CompletionAssembler
from ..context import Gateway
from ..embeddings import embed
from .. import keep_alive as client_keep_alive
from ..loading import sse_comment
from ..skeleton import SSE_HEADERS, exchange, inbound, started_stream
from ..usage import UsageFold
from .models import openai_entry
from .request import StreamOptions, parse_request

_encode = msgspec.json.encode


def error_chunk(message: str, kind: str = "api_error") -> bytes:
    return b"data: " + _encode({"error": {"message": message, "type": kind, "param": None, "code": None}}) + b"\n\n"


def _backend(ex: Exchange) -> BackendState:
    """The backend an exchange was let in on (the skeleton's `exchange` yields it placed)."""
    assert ex.backend is not None
    return ex.backend


def _client(ex: Exchange) -> UpstreamClient:
    """The client of an exchange whose upstream call is open (after `open_chat`)."""
    assert ex.client is not None
    return ex.client


def _checked_completion(raw: bytes, ex: Exchange, t: Tracked) -> None:
    """The decoded completion, or the backend's failure as a GatewayError in its own kind."""
    try:
        doc = validate_completion(raw)
    except Malformed as err:
        raise GatewayError("upstream_malformed", f"backend {_backend(ex).name!r}: {clean_message(str(err))}") from None
    except ErrorBody as err:  # an error in a 200 body: not relayed as it is
        raise GatewayError("upstream_error", f"backend {_backend(ex).name!r} failed: {clean_message(str(err))}") from None
    if doc.usage is not None:
        UsageFold(t, ex, first=False).add(doc.usage.prompt_tokens, doc.usage.completion_tokens, doc.usage.cached, 0)


class _Chat:
    """The parsed request as the skeleton's step 1 takes it (`model`, `stream`)."""

    __slots__ = ("req", "usage", "model", "stream")

    def __init__(self, req: c.Request, usage: StreamOptions) -> None:
        self.req, self.usage = req, usage
        self.model, self.stream = req.model, req.stream


class _Loading:
    """What a Chat Completions stream gets while its model loads (surfaces/loading.py): SSE
    comments; with `lifecycle.loading_note`, the first as a `reasoning_content` delta instead
    (where llama-swap puts its note), which a client shows as the model's reasoning."""

    stream_headers = SSE_HEADERS

    def __init__(self, model: str) -> None:
        self.model = model

    def loading_frame(self, model: str, waited_s: float, first: bool, note: bool) -> bytes:
        if not (note and first):
            return sse_comment(model, waited_s)
        chunk = {"id": "chatcmpl-loading", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": self.model, "choices": [{"index": 0, "delta": {
                     "role": "assistant", "reasoning_content": f"loading model {self.model}...\n"},
                     "finish_reason": None}]}
        return b"data: " + _encode(chunk) + b"\n\n"

    def early_failure(self, err: GatewayError) -> bytes:
        return error_chunk(err.message, "timeout_error" if err.kind == "timeout" else "api_error")


def _parse(body: bytes) -> _Chat:
    return _Chat(*parse_request(body))


async def chat_completions(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    front = await inbound(request, gw, t, "openai", _parse)
    req, usage_opts = front.parsed.req, front.parsed.usage
    route = front.route
    async with exchange(request, gw, t, front, req, _Loading(route.client_model)) as ex:
        # a plain answer is streamed from backends that cannot stop a plain generation (llama.cpp)
        streamed = req.stream or _backend(ex).cfg.streams_upstream
        # vLLM's usage on every chunk, when the client asks for it (only vLLM backends get it)
        continuous = usage_opts.continuous_usage_stats
        rewrite = ModelRewriter(route.upstream_model, route.client_model)
        if not req.stream:
            if streamed:  # a backend that breaks off mid-way fails over: none of it went out
                raw = await ex.whole(lambda: _whole_from_stream(ex, req, t, continuous))
            else:
                upstream = await open_chat(ex, req, stream=False, continuous_usage=continuous)
                raw = await _client(ex).read_all(upstream)
                ex.complete = True
            _checked_completion(raw, ex, t)
            out = web.Response(body=rewrite(raw), content_type="application/json", headers=gw.headers(t))
            await out.prepare(request)
            await out.write_eof()
            return out
        upstream = await open_chat(ex, req, stream=True, continuous_usage=continuous)
        sse = started_stream(request, SSE_HEADERS, gw, t)
        if not sse.prepared:
            await sse.prepare(request)
        await _relay(request, upstream, sse, ex, t, rewrite, usage_opts.include_usage)
        return sse


async def _whole_from_stream(ex: Exchange, req: c.Request, t: Tracked, continuous: bool) -> bytes:
    """A plain answer, read from an upstream stream (the gateway folds the chunks into the
    chat.completion the upstream would have sent). A client that leaves meanwhile closes the
    stream, which llama.cpp notices at its next token. A stream that breaks off is
    UpstreamFailure(cause="broke"): Exchange.whole tries another backend."""
    upstream = await open_chat(ex, req, stream=True, continuous_usage=continuous)
    t.generating()  # no first token to report to a client that waits for the whole answer
    asm = CompletionAssembler()
    name = _backend(ex).name
    try:
        async for batch in _client(ex).sse(upstream):
            ex.progress += 1
            for payload in batch:
                if payload == b"[DONE]":
                    ex.complete = True
                    continue
                try:
                    asm.feed(payload)
                except ValueError as err:
                    raise GatewayError("upstream_malformed", f"backend {name!r}: {clean_message(str(err))}") from None
                if asm.error is not None:
                    raise GatewayError("upstream_error", f"backend {name!r} failed: {clean_message(asm.error)}")
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionResetError):
        raise UpstreamFailure("upstream_error", f"backend {name!r} closed the connection before its answer was complete",
                              cause="broke") from None
    if not ex.complete:
        raise UpstreamFailure("upstream_error", f"backend {name!r} ended the stream without finishing it", cause="broke")
    counts = asm.counts
    UsageFold(t, ex, first=False).add(counts.input_tokens, counts.output_tokens, counts.cached_input_tokens,
                                      asm.pieces)
    return _encode(asm.result())


async def _relay(request: web.Request, upstream: aiohttp.ClientResponse, out: web.StreamResponse, ex: Exchange,
                 t: Tracked, rewrite: ModelRewriter,
                 client_wants_usage: bool) -> None:
    done = False
    thought = False  # reasoning seen: only the first may carry vLLM's stray <think> (strip_think)
    failure: str | None = None
    failure_type = "api_error"
    fold = UsageFold(t, ex)
    add = fold.add
    # the rewrite's fast path inline (see model_rewrite): one replace per chunk, as it always was
    needle, repl = rewrite.needle, rewrite.repl
    try:
        async for batch in _client(ex).sse(upstream):
            ex.progress += 1
            frames = []
            for payload in batch:
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    info = decode_chunk(payload)
                except ChunkMalformed as err:
                    failure = f"the backend sent a malformed chunk: {clean_message(str(err))}"
                    break
                if not thought and info.choices and (d := info.choices[0].delta) is not None:
                    r = d.reasoning or d.reasoning_content
                    if r:
                        thought = True
                        if r.startswith(THINK_TAG):
                            payload = strip_think(payload)
                renamed = payload.replace(needle, repl)
                if renamed is payload:  # not compact, or another name: the exact way
                    renamed = rewrite.miss(payload)
                    needle = rewrite.needle
                payload = renamed
                if info.error is not None or info.object == "error":  # chunk_error's test, inline
                    failed = chunk_error(info)
                    assert failed is not None
                    failure = f"the backend failed mid-stream: {failed.message}"
                    break
                generated = 0
                if info.choices:
                    d = info.choices[0].delta
                    if d is not None and (d.content or d.reasoning or d.reasoning_content or d.tool_calls):
                        generated = 1
                u = info.usage
                if u is not None:  # vLLM's continuous usage rides on the chunks that generate
                    if add(u.prompt_tokens, u.completion_tokens, u.cached, generated):
                        frames.append(b"data: " + payload + b"\n\n")
                        await ex.send(out, b"".join(frames))  # the first token goes out at once
                        frames = []
                        continue
                    if not info.choices and not client_wants_usage:
                        continue
                elif generated:
                    if add(None, None, None, 1):
                        # the first token goes out at once, not after the rest of its batch
                        frames.append(b"data: " + payload + b"\n\n")
                        await ex.send(out, b"".join(frames))
                        frames = []
                        continue
                frames.append(b"data: " + payload + b"\n\n")
            if frames:
                await ex.send(out, b"".join(frames))
            if failure:
                break
    except UpstreamTooLarge as err:
        t.fail("upstream_too_large", override=True)
        failure = err.message
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionResetError):
        if client_gone(request):
            raise  # our own write failed: the client left (the wrapper counts it as a cancel)
        failure = "the backend closed the connection mid-stream"
    except asyncio.CancelledError:
        own = ex.own_cancel()
        if own is None:
            raise  # the client went away
        t.fail(own.kind)
        failure = own.message
        failure_type = "timeout_error" if own.kind == "timeout" else "api_error"
    if failure is None and not done:
        failure = "the backend ended the stream without finishing it"
    if failure is not None:
        t.fail("upstream_midstream")
        await out.write(error_chunk(failure, failure_type))
        await out.write_eof()
        return
    ex.complete = True
    await out.write(b"data: [DONE]\n\n")
    t.answered = True
    await out.write_eof()


async def models(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """Every model the key may use, each with what it is (surfaces/openai/models.py)."""
    gw.auth.admit(request, None, "openai")
    now = int(time.time())
    listed = []
    for name in gw.router.model_names():
        route = gw.router.resolve(name)
        if gw.auth.may_use(request, route):  # a key sees only the models it may use
            listed.append((name, route))
    data = [openai_entry(card, now) for card in await model_card.cards(gw, listed)]
    t.end(DONE, override=True)
    return web.Response(
        body=_encode({"object": "list", "data": data}),
        content_type="application/json",
        headers=gw.headers(t),
    )


async def embeddings(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    body = await gw.read_body(request)
    raw = await gw.parse(body, decode_object)
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError("invalid_request", "model: required string field is missing", param="model")
    if "input" not in raw:
        raise GatewayError("invalid_request", "input: required field is missing", param="input")
    t.model = model
    asked = client_keep_alive.parse(raw.get("keep_alive"))
    route = gw.router.resolve(model)
    principal = gw.auth.admit(request, route, "openai")
    client_keep_alive.apply(gw, route, asked)
    allowed = ("input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens")
    upstream_body = {"model": route.upstream_model, **{k: raw[k] for k in allowed if k in raw}}
    async with gw.hold(principal), Exchange(t, route, gw.clients, principal) as ex:
        await ex.admit()
        result, _ = await embed(ex, _encode(upstream_body))
        rewrite = ModelRewriter(route.upstream_model, route.client_model)
        out = web.Response(body=rewrite(result), content_type="application/json", headers=gw.headers(t))
        await out.prepare(request)
        await out.write_eof()
        return out
