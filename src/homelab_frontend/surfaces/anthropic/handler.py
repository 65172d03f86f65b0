"""The Anthropic Messages surface: POST /llm/v1/messages (plain and streaming) and
/llm/v1/messages/count_tokens. Glue only: parsing is in request.py, the stream grammar in
stream.py, whole-message assembly in response.py, upstream chunk decoding in upstream/decode.py.

While a streaming request waits for a slot, no response headers are sent yet: a refusal can then
still be a proper 529 with Retry-After, which clients (Claude Code included) retry on. Once the
slot is held and the upstream has answered, `message_start` goes out and `ping` frames keep the
connection alive whenever the upstream is silent for `anthropic.ping_interval_s`.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec
from aiohttp import web

from ... import canonical as c
from ...policy.affinity import session_key
from ...request.context_clamp import open_chat
from ...errors import GatewayError, clean_message
from ...request.exchange import Exchange
from ...upstream.prompt_count import count_prompt
from ...upstream.stopmatch import StopMatcher
from ...request.tracker import GENERATING, Tracked
from ...upstream.decode import Malformed, decode_completion
from ...upstream.chat_body import build_body
from ..body import decode_object
from ..upstream_events import Midstream as _Midstream
from ..upstream_events import gateway_stops as _gateway_stops
from ..upstream_events import stream_events as _stream_events
from .request import parse_request
from .response import MessageAssembler, new_message_id
from .stream import AnthropicStreamEncoder
from ..context import Gateway

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_COUNT_WAIT_S = 2.0  # at the end of an answer the prompt count has long arrived; if not, estimate


def _estimated_input_tokens(body: bytes, req: c.Request) -> int:
    """About four bytes of request per prompt token, image data left out. message_start must carry
    input_tokens and clients size their context from it, but the upstream may not have said yet:
    Ollama reports usage only at the end, and vLLM on its first chunk, which a keep-alive ping
    during a long prefill precedes. Used only then; message_delta carries the real count."""
    images = sum(len(p.url) for m in req.messages for p in m.parts if isinstance(p, c.ImagePart))
    return max(1, (len(body) - images) // 4)


async def messages(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    body = await gw.read_body(request)
    req = await gw.parse(body, lambda b: parse_request(b, signer=gw.signer))
    t.model, t.stream = req.model, req.stream
    route = gw.router.resolve(req.model)
    principal = gw.auth.admit(request, route, "anthropic")
    message_id = new_message_id()
    session = session_key(request.headers, req) if route.wants_session else None
    async with gw.hold(principal), Exchange(t, route, gw.clients, principal, session) as ex:
        await ex.admit()
        gateway_stops = _gateway_stops(req, ex)
        matcher = StopMatcher(req.stop) if gateway_stops else None
        if not req.stream:
            result = await _whole_message(req, ex, t, message_id, gw, matcher, _estimated_input_tokens(body, req))
            out = web.Response(body=msgspec.json.encode(result), content_type="application/json",
                               headers=gw.headers(t))
            await out.prepare(request)
            await out.write_eof()
            return out
        ex.ping_interval = gw.cfg.anthropic.ping_interval_s  # before open: the watchdog's tick
        upstream = await open_chat(ex, req, stream=True, continuous_usage=True, send_stop=not gateway_stops,
                                   count_prompt=True)
        out = web.StreamResponse(headers={**SSE_HEADERS, **gw.headers(t)})
        await out.prepare(request)
        enc = AnthropicStreamEncoder(message_id=message_id, model=req.model, signer=gw.signer,
                                     input_tokens=ex.prompt_tokens_or(_estimated_input_tokens(body, req)),
                                     hide_reasoning=req.reasoning_hidden)
        ex.on_idle = lambda: out.write(enc.ping())
        try:
            await _relay(upstream, ex, t, enc, out, matcher)
        except GatewayError as err:  # our own timeout or cancel, after the stream started
            t.fail(err.kind)
            await out.write(enc.fail("timeout_error" if err.kind == "timeout" else "api_error", err.message))
        await out.write_eof()
        await ex.drain()
        return out


async def _relay(upstream, ex: Exchange, t: Tracked, enc: AnthropicStreamEncoder, out, matcher) -> None:
    # Hidden reasoning (display "omitted") writes nothing while the upstream streams it, and the
    # watchdog pings only a silent upstream: the client still gets a `ping` every ping interval.
    loop = asyncio.get_running_loop()
    quiet_since: float | None = None
    try:
        async for events in _stream_events(upstream, ex, matcher, ex.first_token):
            frames = []
            for ev in events:
                if isinstance(ev, c.Usage):
                    if ev.input_tokens is not None:
                        t.tokens_in = ev.input_tokens
                    if ev.output_tokens is not None:
                        t.tokens_out = ev.output_tokens
                    if ev.cached_input_tokens is not None:
                        t.tokens_cached = ev.cached_input_tokens
                elif isinstance(ev, (c.TextDelta, c.ReasoningDelta, c.ToolArgsDelta)):
                    t.tokens_out += 1
                frames.append(enc.feed(ev))
            data = b"".join(frames)
            if data:
                await ex.send(out, data)
                quiet_since = None
            elif ex.ping_interval:
                now = loop.time()
                if quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= ex.ping_interval:
                    await ex.send(out, enc.ping())
                    quiet_since = now
            if enc.ended:
                t.fail("upstream_midstream", override=True)
                return
        if enc.output_tokens is None:
            # the gateway stopped the generation (a stop sequence) before the upstream reported
            # usage: its own count, one token per delta, and the tokenizer's prompt (README: usage)
            prompt = await ex.counted_prompt(_COUNT_WAIT_S)
            if prompt is not None:
                t.tokens_in = prompt
            enc.feed(c.Usage(input_tokens=prompt, output_tokens=t.tokens_out))
        await out.write(enc.finish())
    except _Midstream as err:
        t.fail(err.kind, override=True)
        await out.write(enc.fail("api_error", str(err)))
    except asyncio.CancelledError:
        err = ex.own_cancel()
        if err is None:
            raise
        raise err from None


async def _whole_message(req: c.Request, ex: Exchange, t: Tracked, message_id: str, gw, matcher,
                         estimated_input: int) -> dict:
    asm = MessageAssembler(message_id=message_id, model=req.model, signer=gw.signer,
                           hide_reasoning=req.reasoning_hidden)
    counted = 0  # generated deltas: the gateway's own count where the upstream reports none
    if matcher is None and not ex.backend.cfg.streams_upstream:
        upstream = await open_chat(ex, req, stream=False)
        raw = await ex.client.read_all(upstream)
        ex.complete = True
        try:
            events = decode_completion(raw)
        except ValueError as err:  # Malformed, or an error body sent with 200
            kind = "upstream_malformed" if isinstance(err, Malformed) else "upstream_error"
            raise GatewayError(kind, f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None
        for ev in events:
            asm.feed(ev)
    else:
        # streamed for the gateway's stop matching, or because the backend cannot stop a plain
        # generation (config.Backend.streams_upstream): no first token to await either way
        upstream = await open_chat(ex, req, stream=True, send_stop=matcher is None, count_prompt=matcher is not None)
        t.phase = GENERATING
        try:
            async for events in _stream_events(upstream, ex, matcher):
                for ev in events:
                    if isinstance(ev, (c.TextDelta, c.ReasoningDelta, c.ToolArgsDelta)):
                        counted += 1
                    asm.feed(ev)
        except _Midstream as err:
            kind = "upstream_too_large" if err.kind == "upstream_too_large" else "upstream_error"
            raise GatewayError(kind, str(err)) from None
    result = asm.result()
    usage = result["usage"]
    # A generation the gateway stopped itself (a stop sequence) ends before the upstream's usage
    # chunk: the gateway's own figures then, never null (README: usage)
    if usage["output_tokens"] is None:
        usage["output_tokens"] = counted
    if usage["input_tokens"] is None:
        prompt = await ex.counted_prompt(_COUNT_WAIT_S)
        usage["input_tokens"] = prompt if prompt is not None else estimated_input
    t.tokens_cached = usage.get("cache_read_input_tokens")
    t.tokens_in = usage.get("input_tokens")
    if t.tokens_in is not None and t.tokens_cached is not None:
        t.tokens_in += t.tokens_cached  # the log and metrics count the whole prompt, as upstream
    t.tokens_out = usage.get("output_tokens") or 0
    return result


async def count_tokens(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    """A real count from the backend's tokenizer (vLLM, llama.cpp: chat template and tools
    included, upstream/prompt_count.py); other backends have no tokenizer endpoint, so the answer there is
    an estimate (README: count_tokens)."""
    body = await gw.read_body(request)

    def parse(b: bytes) -> c.Request:
        raw = decode_object(b)
        raw.setdefault("max_tokens", 1)  # count_tokens takes no max_tokens; the parser wants one
        return parse_request(msgspec.json.encode(raw), signer=gw.signer)

    req = await gw.parse(body, parse)
    t.model = req.model
    route = gw.router.resolve(req.model)
    gw.auth.admit(request, route, "anthropic")
    backend = route.choose()
    t.backend = backend.name
    chat = msgspec.json.decode(
        build_body(req, upstream_model=route.upstream_model, backend=backend.cfg, stream=False, max_tokens=None,
                   system_turns=route.system_turns)
    )
    count = await count_prompt(gw.clients[backend.name], backend.cfg.kind, chat)
    if count is None:
        # No tokenizer endpoint: about four bytes of chat text per token.
        count = max(1, len(msgspec.json.encode(chat["messages"])) // 4)
    t.tokens_in = count
    return web.Response(
        body=msgspec.json.encode({"input_tokens": count}),
        content_type="application/json",
        headers=gw.headers(t),
    )
