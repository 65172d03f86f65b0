"""The OpenAI Responses surface: POST /llm/v1/responses (plain and streaming), GET and DELETE
/llm/v1/responses/{id}. The dialect's parts only: the request/answer cycle is surfaces/skeleton.py;
parsing is in request.py, the stream grammar in stream.py, the Response object in assemble.py,
stored responses in store.py (the surface's share of the gateway in state.py), reasoning blobs
in sealed.py.

Like the Anthropic surface, a streaming request sends no headers while it waits for a slot and
for the upstream's answer, so a refusal is still a whole HTTP error (429 with Retry-After, 400
context_length_exceeded) that clients act on. From the first frame on, a failure is one
`response.failed` event and the stream ends.

A stored response is written before the client sees `response.completed` (or the plain body), so
a client that continues with `previous_response_id` at once always finds it.
"""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from ... import canonical as c
from ...errors import GatewayError
from ...policy import limits
from ...request.exchange import Exchange
from ...request.tracker import Tracked
from ..context import Gateway
from ..skeleton import Inbound, Turn, answer, exchange, inbound
from . import items
from .errors import failure_code
from .request import ParsedRequest, parse_request
from .assemble import base_response, new_id
from .sealed import ReasoningSealer
from .state import ResponsesState
from .store import Record
from .stream import ResponsesStreamEncoder

log = logging.getLogger("homelab_frontend")
_encode = msgspec.json.encode


def _parse(body: bytes, lim, sealer: ReasoningSealer, resolved: dict | None = None) -> ParsedRequest:
    limits.check_json(body, lim, counted=("input",))  # Gateway.parse counted messages and tools
    return parse_request(body, sealer=sealer, resolved=resolved)


def _owner(principal) -> str:
    return principal.name or ""


async def _load(state: ResponsesState, resp_id: str, owner: str, param: str | None) -> Record | None:
    try:
        return await state.store.get(resp_id, owner)
    except Exception as err:  # a store that fails is the gateway's trouble, said plainly
        log.warning("responses store: read failed: %s", err)
        raise GatewayError("api_error", "the response store is not available", param=param, status=503) from None


async def _save(state: ResponsesState, resp_id: str, rec: Record) -> None:
    try:
        await state.store.put(resp_id, rec)
    except Exception as err:  # the answer is still good: only its continuation is lost
        log.warning("responses store: write of %s failed: %s", resp_id, err)


def conversation(history: list[c.Message], parsed: ParsedRequest, output: list[dict]) -> list[c.Message]:
    """What a continuation starts from: the earlier turns, this input, this answer as one
    assistant turn (upstream names and reasoning kept: the store is the gateway's own)."""
    flat = {v: k for k, v in parsed.names.items()}
    reasoning: list[str] = []
    parts: list[c.Part] = []
    calls: list[c.ToolCall] = []
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


class _Response(Turn):
    """One Responses request on the skeleton (surfaces/skeleton.py). Its one encoder serves both
    the stream and the whole answer (`enc.response()` is the Response object either way)."""

    midstream_code = "server_error"

    def __init__(self, state: ResponsesState, parsed: ParsedRequest, history: list[c.Message], owner: str,
                 as_summary: bool = False) -> None:
        self.state, self.parsed, self.history, self.owner = state, parsed, history, owner
        self.req = parsed.canonical(history)
        self.resp_id = new_id("resp_")
        self.enc = ResponsesStreamEncoder(base=base_response(self.resp_id, parsed, parsed.previous_response_id),
                                          names=parsed.names,
                                          sealer=state.sealer if parsed.include_encrypted else None,
                                          summary=parsed.reasoning_summary and as_summary)

    def encoder(self) -> ResponsesStreamEncoder:
        return self.enc

    def own_failure_code(self, err: GatewayError) -> str:
        return failure_code(err)

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        enc = self.enc
        assert ex.backend is not None
        enc.counts_reasoning = ex.backend.cfg.streams_upstream  # else one reasoning text, not tokens
        for ev in events:
            enc.feed(ev)
        if enc.failed:
            assert ex.backend is not None
            raise GatewayError("upstream_error", f"backend {ex.backend.name!r} failed: {enc.response()['error']['message']}")
        enc.finish()
        return enc.response()

    async def before_final(self) -> None:
        # stored before the client sees the answer: a continuation sent at once finds it
        enc, parsed = self.enc, self.parsed
        if parsed.store and not enc.failed:
            rec = Record(self.owner, enc.response(), conversation(self.history, parsed, enc.output),
                         items.number_inputs(parsed.input_items, self.resp_id))
            await _save(self.state, self.resp_id, rec)


async def create(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    state: ResponsesState = gw.responses
    front: Inbound[ParsedRequest] = await inbound(request, gw, t, "responses",
                                                   lambda b: _parse(b, gw.cfg.limits, state.sealer))
    parsed = front.parsed
    owner = _owner(front.principal)
    if parsed.references:  # item_reference items: read from the store, then parsed in their place
        found = await items.resolve(parsed.references, lambda rid: _load(state, rid, owner, "input"))
        parsed = await gw.parse(front.body, lambda b: _parse(b, gw.cfg.limits, state.sealer, found))
    history: list[c.Message] = []
    prev = parsed.previous_response_id
    if prev:  # before admission: a conversation that is not there costs no slot
        rec = await _load(state, prev, owner, "previous_response_id")
        if rec is None:
            raise GatewayError("not_found", f"previous_response_id: no response with id {prev!r}",
                               param="previous_response_id")
        history = rec.history
    turn = _Response(state, parsed, history, owner, gw.cfg.responses.reasoning_as_summary)
    async with exchange(request, gw, t, front, turn.req, turn) as ex:
        return await answer(request, gw, t, ex, turn)


async def _stored(request: web.Request, gw: Gateway, t: Tracked) -> Record:
    """The stored response the path's {id} names, when the caller's key may read it (else 404)."""
    principal = gw.auth.admit(request, None, "responses")
    resp_id = request.match_info["id"]
    rec = await _load(gw.responses, resp_id, _owner(principal), None)
    if rec is None:
        raise GatewayError("not_found", f"no response with id {resp_id!r}")
    t.model = rec.response.get("model") or ""
    return rec


async def retrieve(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    rec = await _stored(request, gw, t)
    return web.Response(body=_encode(rec.response), content_type="application/json", headers=gw.headers(t))


async def input_items(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    rec = await _stored(request, gw, t)
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
