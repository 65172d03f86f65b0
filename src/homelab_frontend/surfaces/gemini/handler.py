"""The Gemini API surface, under `/llm/v1beta/` and `/llm/v1/` (so `GOOGLE_GEMINI_BASE_URL` and the
GenAI SDKs' `base_url` are `http://HOST:8080/llm`):

    POST models/{model}:generateContent         a whole answer
    POST models/{model}:streamGenerateContent   ?alt=sse: SSE `data:` chunks; else one JSON array
    POST models/{model}:countTokens             the backend's tokenizer (upstream/prompt_count.py)
    POST models/{model}:embedContent            the backend's /embeddings
    POST models/{model}:batchEmbedContents
    GET  models, GET models/{model}             in Google's shape (models.py)

The dialect's parts only: the request cycle is surfaces/skeleton.py, parsing request.py, the
stream grammar stream.py, the whole answer assemble.py, the wire rules rules.py.

While a request waits for a slot no response header is sent, so a refusal is still a whole HTTP
error (429 RESOURCE_EXHAUSTED with Retry-After and a RetryInfo, which Gemini CLI times its retry
by). There are no keep-alive frames (both SDKs break on them): a silent upstream is a silent
stream, bounded by the gateway's timeouts. A failure once the stream has begun is stream.py's
`fail()`, the form the SDKs raise on, framed so that it is a read of its own.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from ... import canonical as c
from ...errors import GatewayError
from ...policy import limits
from ...request.exchange import Exchange
from ...request.outcome import DONE
from ...request.tracker import Tracked
from .. import model_card
from ..context import Gateway
from ..count_tokens import prompt_tokens
from ..embeddings import embed, vectors
from ..fields import invalid
from ..skeleton import SSE_HEADERS, StreamEncoder, Turn, answer, exchange, inbound
from .models import count_request, embed_inputs, model_entry, model_name
from .request import parse_body, parse_request, request_from
from .assemble import ResponseAssembler
from .rules import new_response_id
from .stream import Framing, GeminiStreamEncoder

DIALECT = "gemini"
_encode = msgspec.json.encode
_ARRAY_HEADERS = {"content-type": "application/json", "cache-control": "no-cache"}


class _Generate(Turn):
    """One generateContent / streamGenerateContent request on the skeleton."""

    midstream_code = "INTERNAL"

    def __init__(self, req: c.Request, gw: Gateway, framing: Framing) -> None:
        self.req = req
        self.signer = gw.signer
        self.framing = framing
        self.response_id = new_response_id()
        self.stream_headers = SSE_HEADERS if framing == "sse" else _ARRAY_HEADERS

    def encoder(self) -> GeminiStreamEncoder:
        req = self.req
        return GeminiStreamEncoder(model=req.model, response_id=self.response_id, signer=self.signer,
                                   include_thoughts=not req.reasoning_hidden, framing=self.framing)

    def own_failure_code(self, err: GatewayError) -> str:
        if err.kind == "timeout":
            return "DEADLINE_EXCEEDED"
        return "UNAVAILABLE" if err.kind == "overloaded" else "INTERNAL"

    def finish(self, enc: StreamEncoder, ex: Exchange) -> bytes:
        assert isinstance(enc, GeminiStreamEncoder)
        if enc.usage.output_tokens is None:
            # the gateway stopped the generation (a stop sequence) before the upstream reported
            # usage: its own count, one token per delta (README: usage)
            enc.feed(c.Usage(output_tokens=ex.t.tokens_out))
        return enc.finish()

    def whole(self, events: list[c.Event], ex: Exchange) -> dict:
        asm = ResponseAssembler(model=self.req.model, response_id=self.response_id, signer=self.signer,
                                include_thoughts=not self.req.reasoning_hidden)
        for ev in events:
            asm.feed(ev)
        if asm.usage.output_tokens is None:
            asm.feed(c.Usage(output_tokens=ex.t.tokens_out))
        return asm.result()


def _target(request: web.Request) -> tuple[str, str]:
    """(model, method) of `models/{model}:{method}`; a model name may itself hold colons."""
    name, sep, method = request.match_info["target"].rpartition(":")
    if not sep:
        raise GatewayError("not_found", f"no such endpoint: {request.method} {request.path} "
                                        "(expected models/{model}:generateContent or another method)")
    return model_name(name), method


_METHODS = ("generateContent", "streamGenerateContent", "countTokens", "embedContent", "batchEmbedContents")


async def model_method(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
    model, method = _target(request)
    if method in _METHODS:  # the endpoint as Google writes it: `.../models/{model}:generateContent`
        t.endpoint = t.endpoint.replace("{target}", "{model}:" + method)
    if method in ("generateContent", "streamGenerateContent"):
        return await _generate(request, gw, t, model, method == "streamGenerateContent")
    if method == "countTokens":
        return await _count_tokens(request, gw, t, model)
    if method in ("embedContent", "batchEmbedContents"):
        return await _embed(request, gw, t, model, method == "batchEmbedContents")
    raise GatewayError("not_found", f"method {method!r} is not supported by this gateway ({', '.join(_METHODS)})")


def _parse_generate(body: bytes, gw: Gateway, model: str, stream: bool) -> c.Request:
    lim = gw.cfg.limits
    limits.check_json(body, lim, counted=("contents",))  # Gateway.parse counted messages and tools
    req = parse_request(body, model=model, stream=stream, signer=gw.signer)
    if len(req.tools) > lim.max_tools:  # Gemini's declarations sit one level down, in tools[i]
        raise GatewayError("invalid_request", f"tools: {len(req.tools)} function declarations is more than the "
                                              f"limit of {lim.max_tools} (limits.max_tools)", param="tools")
    return req


async def _generate(request: web.Request, gw: Gateway, t: Tracked, model: str, stream: bool) -> web.StreamResponse:
    framing: Framing = "sse" if request.query.get("alt") == "sse" else "array"
    front = await inbound(request, gw, t, DIALECT, lambda b: _parse_generate(b, gw, model, stream))
    turn = _Generate(front.parsed, gw, framing)
    # no announcer (surfaces/loading.py): Google's JS SDKs match `^data: ` at the start of what
    # they have buffered, so any byte before the first event (a comment, a blank line) stalls them
    async with exchange(request, gw, t, front, turn.req) as ex:
        return await answer(request, gw, t, ex, turn)


def _json(gw: Gateway, t: Tracked, doc: Any) -> web.Response:
    return web.Response(body=_encode(doc), content_type="application/json", headers=gw.headers(t))


async def _count_tokens(request: web.Request, gw: Gateway, t: Tracked, model: str) -> web.Response:
    """The backend's own count, else an estimate (surfaces/count_tokens.py)."""
    count = await prompt_tokens(request, gw, t, DIALECT, lambda b: request_from(
        count_request(parse_body(b)), model=model, stream=False, signer=gw.signer))
    return _json(gw, t, {"totalTokens": count})


class _EmbedParsed:
    __slots__ = ("model", "stream", "texts", "dimensions")

    def __init__(self, model: str, texts: list[str], dimensions: int | None) -> None:
        self.model, self.stream, self.texts, self.dimensions = model, False, texts, dimensions


def _parse_embed(body: bytes, model: str, batch: bool) -> _EmbedParsed:
    raw = parse_body(body)
    texts = embed_inputs(raw, batch)
    dims = raw.get("outputDimensionality", raw.get("output_dimensionality"))
    if batch and dims is None:
        first = raw["requests"][0]  # embed_inputs saw a non-empty list there
        dims = first.get("outputDimensionality", first.get("output_dimensionality")) if isinstance(first, dict) else None
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise invalid("outputDimensionality", f"must be an integer >= 1, got {dims!r}")
    return _EmbedParsed(model, texts, dims)


async def _embed(request: web.Request, gw: Gateway, t: Tracked, model: str, batch: bool) -> web.Response:
    """Text embeddings from the backend's `/embeddings` (vLLM and llama.cpp with an embedding
    model, Ollama): as honest as the backend. A backend without one answers 404, passed on."""
    front = await inbound(request, gw, t, DIALECT, lambda b: _parse_embed(b, model, batch))
    parsed: _EmbedParsed = front.parsed
    upstream_body: dict = {"model": front.route.upstream_model, "input": parsed.texts}
    if parsed.dimensions is not None:
        upstream_body["dimensions"] = parsed.dimensions
    async with exchange(request, gw, t, front, c.Request(model=model, messages=[])) as ex:
        _, doc = await embed(ex, _encode(upstream_body))
        got = vectors(ex, doc.data, len(parsed.texts))
        if batch:
            return _json(gw, t, {"embeddings": [{"values": v} for v in got]})
        return _json(gw, t, {"embedding": {"values": got[0]}})


async def _entries(gw: Gateway, request: web.Request, names: list[str]) -> list[dict]:
    listed = []
    for name in names:
        route = gw.router.resolve(name)
        if gw.auth.may_use(request, route):
            listed.append((name, route))
    return [model_entry(card.name, card.model, card.context_length, card.capabilities)
            for card in await model_card.cards(gw, listed)]


async def list_models(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    gw.auth.admit(request, None, DIALECT)
    models = await _entries(gw, request, gw.router.model_names())
    t.end(DONE, override=True)
    return _json(gw, t, {"models": models})


async def get_model(request: web.Request, gw: Gateway, t: Tracked) -> web.Response:
    name = model_name(request.match_info["name"])
    gw.auth.admit(request, None, DIALECT)
    t.model = name
    got = await _entries(gw, request, [name])
    if not got:
        raise GatewayError("permission", f"this key may not use model {name!r}", param="model")
    t.end(DONE, override=True)
    return _json(gw, t, got[0])


def is_google_client(request: web.Request) -> bool:
    """A Gemini SDK or CLI (their key header or query parameter, or their client header): for
    the routes both dialects share, `GET /llm/v1/models` above all."""
    h = request.headers
    return "x-goog-api-key" in h or "x-goog-api-client" in h or "key" in request.query
