"""The OpenAI Responses surface: POST /llm/v1/responses (plain and streaming), GET and DELETE
/llm/v1/responses/{id}. Glue only: parsing is in request.py, the stream grammar in stream.py, the
Response object in response.py, stored responses in store.py, reasoning blobs in sealed.py.

Like the Anthropic surface, a streaming request sends no headers while it waits for a slot and
for the upstream's answer, so a refusal is still a whole HTTP error (429 with Retry-After, 400
context_length_exceeded) that clients act on. From the first frame on, a failure is one
`response.failed` event and the stream ends.

A stored response is written before the client sees `response.completed` (or the plain body), so
a client that continues with `previous_response_id` at once always finds it.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from aiohttp import web

from ... import canonical as c
from ...policy import limits
from ...request.context_clamp import open_chat
from ...errors import GatewayError, clean_message
from ...policy.affinity import session_key
from ...request.exchange import Exchange
from ...request.tracker import GENERATING, Tracked
from ...upstream.decode import Malformed, decode_completion
from ..upstream_events import Midstream, stream_events
from . import items
from .errors import failure_code
from .request import ParsedRequest, parse_request
from .response import base_response, new_id
from .sealed import ReasoningSealer
from .store import Record, RedisStore, SqliteStore
from .stream import ResponsesStreamEncoder
from ..context import Gateway

log = logging.getLogger("homelab_frontend")
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_encode = msgspec.json.encode
_GENERATED = (c.TextDelta, c.ReasoningDelta, c.ToolArgsDelta)


class State:
    """The surface's share of the gateway: the reasoning sealer and the response store."""

    def __init__(self, gw: Gateway) -> None:
        self.sealer = ReasoningSealer(gw.signer)
        cfg = gw.cfg.responses.store
        self.store = RedisStore(cfg, gw.cluster.client) if gw.cluster is not None else SqliteStore(cfg)

    async def close(self) -> None:
        await self.store.close()


def _parse(body: bytes, lim, sealer: ReasoningSealer, resolved: dict | None = None) -> ParsedRequest:
    limits.check_json(body, lim, counted=("input",))  # Gateway.parse counted messages and tools
    return parse_request(body, sealer=sealer, resolved=resolved)


def _owner(principal) -> str:
    return principal.name or ""


async def _load(state: State, resp_id: str, owner: str, param: str | None) -> Record | None:
    try:
        return await state.store.get(resp_id, owner)
    except Exception as err:  # a store that fails is the gateway's trouble, said plainly
        log.warning("responses store: read failed: %s", err)
        raise GatewayError("api_error", "the response store is not available", param=param, status=503) from None


async def _save(state: State, resp_id: str, rec: Record) -> None:
    try:
        await state.store.put(resp_id, rec)
    except Exception as err:  # the answer is still good: only its continuation is lost
        log.warning("responses store: write of %s failed: %s", resp_id, err)


def conversation(history: list[c.Message], parsed: ParsedRequest, output: list[dict]) -> list[c.Message]:
    """What a continuation starts from: the earlier turns, this input, this answer as one
    assistant turn (upstream names and reasoning kept: the store is the gateway's own)."""
    flat = {v: k for k, v in parsed.names.items()}
    reasoning, parts, calls = [], [], []
    for item in output:
        kind = item["type"]
        if kind == "reasoning":
            reasoning.append(items.reasoning_text(item))
        elif kind == "message":
            parts.extend(c.TextPart(x["text"]) for x in item["content"] if x["text"])
        elif kind == "function_call":
            name = flat.get((item.get("namespace"), item["name"]), item["name"])
            calls.append(c.ToolCall(item["call_id"], name, item["arguments"]))
    answer = c.Message("assistant", parts, tool_calls=calls, reasoning="\n\n".join(reasoning) or None)
    return [*history, *parsed.messages, answer]


def _count(t: Tracked, enc: ResponsesStreamEncoder) -> None:
    if enc.prompt_tokens is not None:
        t.tokens_in = enc.prompt_tokens
    if enc.output_tokens is not None:
        t.tokens_out = enc.output_tokens


async def _whole_events(ex: Exchange, req: c.Request, t: Tracked) -> list[c.Event]:
    """The canonical events of a whole answer. From a backend that cannot stop a plain generation
    whose client left (config.Backend.streams_upstream: llama.cpp) the answer is read as a stream,
    so that a client leaving closes it and llama.cpp stops at its next token."""
    if ex.backend.cfg.streams_upstream:
        upstream = await open_chat(ex, req, stream=True)
        t.phase = GENERATING  # no first token to report to a client that waits for the whole answer
        try:
            return [ev async for events in stream_events(upstream, ex, None) for ev in events]
        except Midstream as err:
            kind = "upstream_too_large" if err.kind == "upstream_too_large" else "upstream_error"
            raise GatewayError(kind, str(err)) from None
    upstream = await open_chat(ex, req, stream=False)
    raw = await ex.client.read_all(upstream)
    ex.complete = True
    try:
        return decode_completion(raw)
    except ValueError as err:  # Malformed, or an error body sent with 200
        kind = "upstream_malformed" if isinstance(err, Malformed) else "upstream_error"
        raise GatewayError(kind, f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None


async def create(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    state: State = gw.responses
    body = await gw.read_body(request)
    parsed = await gw.parse(body, lambda b: _parse(b, gw.cfg.limits, state.sealer))
    t.model, t.stream = parsed.model, parsed.stream
    route = gw.router.resolve(parsed.model)
    principal = gw.auth.admit(request, route, "responses")
    owner = _owner(principal)
    if parsed.references:  # item_reference items: read from the store, then parsed in their place
        found = await items.resolve(parsed.references, lambda rid: _load(state, rid, owner, "input"))
        parsed = await gw.parse(body, lambda b: _parse(b, gw.cfg.limits, state.sealer, found))
    history: list[c.Message] = []
    prev = parsed.previous_response_id
    if prev:
        rec = await _load(state, prev, owner, "previous_response_id")
        if rec is None:
            raise GatewayError("not_found", f"previous_response_id: no response with id {prev!r}",
                               param="previous_response_id")
        history = rec.history
    req = parsed.canonical(history)
    resp_id = new_id("resp_")
    enc = ResponsesStreamEncoder(base=base_response(resp_id, parsed, prev), names=parsed.names,
                                 sealer=state.sealer if parsed.include_encrypted else None,
                                 summary=parsed.reasoning_summary)

    async def keep() -> None:
        if parsed.store and not enc.failed:
            await _save(state, resp_id, Record(owner, enc.response(), conversation(history, parsed, enc.output),
                                               items.number_inputs(parsed.input_items, resp_id)))

    session = session_key(request.headers, req) if route.wants_session else None
    async with gw.hold(principal), Exchange(t, route, gw.clients, principal, session) as ex:
        await ex.admit()
        if not req.stream:
            enc.counts_reasoning = ex.backend.cfg.streams_upstream  # else one reasoning text, not tokens
            for ev in await _whole_events(ex, req, t):
                enc.feed(ev)
            if enc.failed:
                raise GatewayError("upstream_error", f"backend {ex.backend.name!r} failed: {enc.response()['error']['message']}")
            enc.finish()
            _count(t, enc)
            await keep()
            out = web.Response(body=_encode(enc.response()), content_type="application/json", headers=gw.headers(t))
            await out.prepare(request)
            await out.write_eof()
            return out
        upstream = await open_chat(ex, req, stream=True, continuous_usage=True)
        out = web.StreamResponse(headers={**SSE_HEADERS, **gw.headers(t)})
        await out.prepare(request)
        try:
            await _relay(upstream, ex, t, enc, out, keep)
        except GatewayError as err:  # our own timeout or cancel, after the stream started
            t.fail(err.kind)
            await out.write(enc.fail(failure_code(err), err.message))
        await out.write_eof()
        await ex.drain()
        return out


async def _relay(upstream, ex: Exchange, t: Tracked, enc: ResponsesStreamEncoder, out, keep) -> None:
    try:
        async for events in stream_events(upstream, ex, None, ex.first_token):
            frames = []
            for ev in events:
                if type(ev) in _GENERATED:
                    t.tokens_out += 1  # a running count for /admin; the upstream's usage replaces it
                frames.append(enc.feed(ev))
            await ex.send(out, b"".join(frames))
            if enc.ended:
                t.fail("upstream_midstream", override=True)
                _count(t, enc)
                return
        _count(t, enc)
        tail = enc.finish()
        await keep()
        await out.write(tail)
    except Midstream as err:
        t.fail(err.kind, override=True)
        await out.write(enc.fail("server_error", str(err)))
    except asyncio.CancelledError:
        err = ex.own_cancel()
        if err is None:
            raise
        raise err from None


async def retrieve(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    principal = gw.auth.admit(request, None, "responses")
    resp_id = request.match_info["id"]
    rec = await _load(gw.responses, resp_id, _owner(principal), None)
    if rec is None:
        raise GatewayError("not_found", f"no response with id {resp_id!r}")
    t.model = rec.response.get("model") or ""
    return web.Response(body=_encode(rec.response), content_type="application/json", headers=gw.headers(t))


async def input_items(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    principal = gw.auth.admit(request, None, "responses")
    resp_id = request.match_info["id"]
    rec = await _load(gw.responses, resp_id, _owner(principal), None)
    if rec is None:
        raise GatewayError("not_found", f"no response with id {resp_id!r}")
    t.model = rec.response.get("model") or ""
    return web.Response(body=_encode(items.page(rec.input_items, request.query)), content_type="application/json",
                        headers=gw.headers(t))


async def delete(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    principal = gw.auth.admit(request, None, "responses")
    resp_id = request.match_info["id"]
    try:
        gone = await gw.responses.store.delete(resp_id, _owner(principal))
    except Exception as err:
        log.warning("responses store: delete failed: %s", err)
        raise GatewayError("api_error", "the response store is not available", status=503) from None
    if not gone:
        raise GatewayError("not_found", f"no response with id {resp_id!r}")
    return web.Response(body=_encode({"id": resp_id, "object": "response.deleted", "deleted": True}),
                        content_type="application/json", headers=gw.headers(t))
