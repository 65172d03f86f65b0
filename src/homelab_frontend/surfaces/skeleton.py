"""The one skeleton every client surface runs on: read, parse, route, admit, exchange, then a
stream or a whole answer. A dialect supplies only its pure parts; the I/O, the slot, the record
and the failure rules live here once.

The steps, and who does what:

1. `inbound(request, gw, t, dialect, parse)`: read the body (`Gateway.read_body`: the size limit),
   parse it (`Gateway.parse`: nesting and count limits, then the dialect's pure `parse`, off the
   loop for large bodies), set `t.model` / `t.stream`, resolve the route, check the key may use
   it (`auth.admit`, 401/403 in the caller's dialect), and hand a `keep_alive` in the body to the
   managed backends of the route (keep_alive.py). -> `Inbound` (body, parsed, route,
   principal). Anything the dialect must do before admission (Responses: load the conversation
   of `previous_response_id`; a 404 then costs no slot) happens between this step and the next.
2. `exchange(request, gw, t, front, req)`: the key's concurrency hold, the `Exchange` (session
   affinity key from the canonical request), `ex.admit()` (the slot; phase `queued`, 429/503
   with Retry-After). An async context manager: leaving it, however, closes the upstream and
   gives the slot back (request/exchange.py).
3. `answer(request, gw, t, ex, turn)`, for a dialect that translates (`Turn`): gateway-side stop
   matching where the backend does not report which stop fired (upstream_events.gateway_stops),
   then
   * a whole answer: from a plain upstream answer, or folded from an upstream stream when the
     backend cannot stop a plain generation (`Backend.streams_upstream`) or the gateway matches
     stops itself; `turn.whole(events, ex)` assembles the dialect's JSON body;
   * a stream: `open_chat` (continuous usage asked for), the headers (`turn.stream_headers`, sent
     only now: a refusal before this is still a whole HTTP error clients retry on), the canonical
     events through `turn.encoder()`, keep-alive pings when `turn.ping_interval` is set (the
     watchdog's `on_idle` for a silent upstream, and here for an upstream whose deltas encode to
     nothing, such as hidden reasoning), then `turn.finish(enc, ex)`; an upstream failure mid-
     stream is `enc.fail(turn.midstream_code, message)`, the gateway's own cancel or timeout
     `enc.fail(turn.own_failure_code(err), message)`; `write_eof`, then `ex.drain()` so the
     upstream connection goes back to the pool.
   `turn.before_final()` runs after the answer is complete and before its last bytes leave
   (Responses stores the response there, so a continuation sent at once finds it).

The OpenAI Chat Completions surface is a relay, not a translation (upstreams speak it): it uses
steps 1 and 2 and keeps its own per-chunk loop (openai/handler.py), which folds usage through
the same `UsageFold.add`.

Where usage is folded into the record: `surfaces/usage.py`, once per upstream chunk, in
`upstream_events.stream_events` (both a stream and a whole answer read as a stream) and through
`UsageFold.whole` for a plain upstream answer. Encoders keep their own copy of the upstream's
counts for the wire (their `Usage.over`); the record never reads them.

What a dialect supplies (all pure, unit tested without sockets):
* a parser `bytes -> P` where P has `.model` and `.stream` (a `canonical.Request`, or the
  dialect's own parsed form that becomes one, like Responses' `ParsedRequest`);
* a `Turn` subclass for one request: `req`, `encoder()` (a `StreamEncoder`), `whole()`, and the
  optional hooks below with their defaults;
* its error renderer (`surfaces/<dialect>/errors.py`, registered in app/request_scope.py).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import msgspec
from aiohttp import web

from .. import canonical as c
from ..errors import ErrorKind, GatewayError, clean_message
from ..policy.affinity import session_key
from ..policy.auth import Principal
from ..policy.routing import Route
from ..request.context_clamp import open_chat
from ..request.exchange import Exchange
from ..request.tracker import Tracked
from ..upstream.decode import ChunkDecoder, Malformed, decode_completion
from ..upstream.client import UpstreamFailure
from ..upstream.stopmatch import StopMatcher
from . import keep_alive as client_keep_alive, loading
from .context import Gateway
from .upstream_events import Midstream, gateway_stops, stream_events
from .usage import UsageFold

log = logging.getLogger("homelab_frontend")
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
# On every streamed answer, whatever its framing (SSE, NDJSON, Gemini's JSON array): an nginx in
# front buffers a response by default (proxy_buffering on) and would hand the client its tokens
# in bursts, or all at the end; this header turns that off for the one response
# (docs/operations.md, tests/integration/test_reverse_proxy.py).
UNBUFFERED = {"x-accel-buffering": "no"}


def stream_response(headers: dict[str, str], own: dict[str, str]) -> web.StreamResponse:
    """A streamed answer's response: the dialect's `headers`, UNBUFFERED, the gateway's `own`."""
    return web.StreamResponse(headers={**headers, **UNBUFFERED, **own})
_encode = msgspec.json.encode


class Parsed(Protocol):
    model: str
    stream: bool


P = TypeVar("P", bound=Parsed)  # what `inbound` parses: it reads the model and stream of it
T = TypeVar("T")  # what an Inbound holds: a handler building one itself may hold none (Ollama's embed)


class Inbound(Generic[T]):
    """A request read, parsed, routed and let in by its key (step 1)."""

    __slots__ = ("body", "parsed", "route", "principal")

    def __init__(self, body: bytes, parsed: T, route: Route, principal: Principal) -> None:
        self.body = body
        self.parsed = parsed
        self.route = route
        self.principal = principal


async def inbound(request: web.Request, gw: Gateway, t: Tracked, dialect: str,
                  parse: Callable[[bytes], P]) -> Inbound[P]:
    """Step 1. `dialect` is the key scope `auth.admit` checks ("openai", "anthropic", ...)."""
    body = await gw.read_body(request)
    parsed = await gw.parse(body, parse)
    t.model, t.stream = parsed.model, parsed.stream
    route = gw.router.resolve(parsed.model)
    principal = gw.auth.admit(request, route, dialect)
    if dialect != "ollama":  # Ollama's parser reads it with the rest (a load or an unload: its handler)
        client_keep_alive.apply(gw, route, client_keep_alive.from_body(body))
    return Inbound(body, parsed, route, principal)


@asynccontextmanager
async def exchange(request: web.Request, gw: Gateway, t: Tracked, front: Inbound,
                   req: c.Request, announcer: loading.Announcer | None = None) -> AsyncIterator[Exchange]:
    """Step 2: the key's hold and an admitted Exchange, for the block's duration. With an
    `announcer` (a streaming dialect's Turn), a stream that waits for its managed model to load
    gets its headers and keep-alive frames at once (loading.py)."""
    session = session_key(request.headers, req) if front.route.wants_session else None
    async with gw.hold(front.principal), Exchange(t, front.route, gw.clients, front.principal, session) as ex:
        if announcer is None:
            await ex.admit()
        else:
            lc = gw.cfg.lifecycle
            await loading.admit(request, t, ex.admit, announcer, lambda: {**UNBUFFERED, **gw.headers(t)},
                                lc.loading_keepalive_s, lc.loading_note)
        yield ex


class StreamEncoder(Protocol):
    """A dialect's stream grammar as a pure state machine (its own module, unit tested with the
    dialect's SDK as the oracle). A Turn with a `ping_interval` gives a `KeepAliveEncoder`."""

    @property
    def ended(self) -> bool:
        """A terminal frame was written (a failure the upstream sent in-band): nothing follows."""
        ...

    def feed(self, event: c.Event) -> bytes: ...

    def finish(self) -> bytes: ...

    def fail(self, code: str, message: str) -> bytes: ...


@runtime_checkable
class ToolCallEncoder(Protocol):
    """An encoder whose grammar carries tool calls (all but plain text ones)."""

    @property
    def dropped_tool_args(self) -> int:
        """Tool-call argument fragments the grammar had no open call for (interleaved calls, a
        call never started): dropped, so the client's call lacks them; `answer` logs the count."""
        ...


@runtime_checkable
class KeepAliveEncoder(StreamEncoder, Protocol):
    """An encoder whose dialect has keep-alive frames (Anthropic's `ping` event)."""

    def ping(self) -> bytes: ...


def keep_alive(turn: "Turn", enc: StreamEncoder) -> Callable[[], bytes] | None:
    """The encoder's `ping` when the Turn asks for keep-alives, else None; a Turn that asks for
    them with an encoder that has none is a programming error, said at the stream's start."""
    if not turn.ping_interval:
        return None
    if not isinstance(enc, KeepAliveEncoder):
        raise TypeError(f"{type(turn).__name__} sets ping_interval but its encoder {type(enc).__name__} has no ping()")
    return enc.ping


class Turn:
    """One request in a translating dialect: what `answer` asks of it. Subclass it; set `req` in
    the constructor and override `encoder` and `whole`; the rest are defaults."""

    stream_headers: dict[str, str] = SSE_HEADERS  # a dialect may choose per request (Gemini's framing)
    midstream_code: ClassVar[str] = "api_error"  # the error code for an upstream failing mid-stream
    ping_interval: float | None = None  # keep-alive pings (encoder.ping()) every so many seconds
    # Count the prompt with the backend's tokenizer beside the upstream call (Exchange.count_prompt),
    # for a dialect that must say the prompt's size before the upstream does (Anthropic's
    # message_start) or where the upstream never will (a generation the gateway stopped itself).
    count_prompt: ClassVar[bool] = False
    # A whole answer is read from an upstream stream too (the completion surfaces: one decoder for
    # both, and a generation whose client left stops at its next token on every backend).
    upstream_stream_only: ClassVar[bool] = False
    req: c.Request
    ex: Exchange  # set by `answer` before it calls any of the methods below

    async def open_upstream(self, ex: Exchange, *, stream: bool, continuous_usage: bool = False,
                            send_stop: bool = True, count_prompt: bool = False):
        """Open the upstream answer (default: the chat completion of `req`). A dialect that speaks
        another upstream endpoint (legacy completions, llama.cpp's /infill) opens its own."""
        return await open_chat(ex, self.req, stream=stream, continuous_usage=continuous_usage,
                               send_stop=send_stop, count_prompt=count_prompt)

    def decoder(self):
        """The decoder of the upstream's stream: `feed(payload) -> events`, `done`."""
        return ChunkDecoder()

    def encoder(self) -> StreamEncoder:
        """A fresh encoder for this answer's stream (called once the headers are sent)."""
        raise NotImplementedError

    def whole(self, events: list[c.Event], ex: Exchange) -> object:
        """The whole answer's JSON body (anything msgspec encodes) from all its canonical events;
        its counts are already in `ex.t`. Raises GatewayError for an upstream failure."""
        raise NotImplementedError

    def own_failure_code(self, err: GatewayError) -> str:
        """The error code of a stream the gateway itself ended (a timeout, an operator's cancel)."""
        return "api_error"

    def finish(self, enc: StreamEncoder, ex: Exchange) -> bytes:
        """The stream's last frames after a normal end (the record's counts are final)."""
        return enc.finish()

    async def before_final(self) -> None:
        """The answer is complete and about to leave (stream: before its final frames)."""

    def loading_frame(self, model: str, waited_s: float, first: bool, note: bool) -> bytes:
        """A keep-alive while the model loads (loading.py): an SSE comment, which says so."""
        return loading.sse_comment(model, waited_s)

    def early_failure(self, err: GatewayError) -> bytes:
        """The stream's error frame for a failure after its headers went out early (loading.py)."""
        return self.encoder().fail(self.own_failure_code(err), err.message)


async def answer(request: web.Request, gw: Gateway, t: Tracked, ex: Exchange, turn: Turn) -> web.StreamResponse:
    """Step 3 for a translating dialect: the whole answer or the stream, written to the client."""
    req = turn.req
    turn.ex = ex
    stops = gateway_stops(req, ex)
    matcher = StopMatcher(req.stop) if stops else None
    if not req.stream:
        events = await whole_events(ex, req, matcher, count_prompt=turn.count_prompt and matcher is not None, turn=turn)
        await _settle_prompt(ex, turn)
        body = turn.whole(events, ex)
        await turn.before_final()
        out: web.StreamResponse = web.Response(body=_encode(body), content_type="application/json",
                                               headers=gw.headers(t))
        await out.prepare(request)
        await out.write_eof()
        return out
    if turn.ping_interval:
        ex.ping_interval = turn.ping_interval  # before open: it sets the watchdog's tick
    upstream = await turn.open_upstream(ex, stream=True, continuous_usage=True, send_stop=not stops,
                                        count_prompt=turn.count_prompt)
    out = started_stream(request, turn.stream_headers, gw, t)
    if not out.prepared:
        await out.prepare(request)
    enc = turn.encoder()
    ping = keep_alive(turn, enc)
    if ping is not None:
        ex.on_idle = lambda: out.write(ping())
    try:
        await _relay(upstream, ex, t, turn, enc, out, matcher, ping)
    except GatewayError as err:  # our own timeout or cancel, after the stream started
        t.fail(err.kind)
        await ex.send(out, enc.fail(turn.own_failure_code(err), err.message))
    if isinstance(enc, ToolCallEncoder) and enc.dropped_tool_args:
        # the client got a tool call without some of its arguments: the backend's doing (it
        # interleaved two calls' arguments, or sent some for a call it never started)
        log.warning("request %s: %d tool-call argument fragments from backend %s had no open call in the %s "
                    "stream and were dropped", t.id, enc.dropped_tool_args, t.backend, t.dialect)
    await out.write_eof()
    await ex.drain()
    return out


def started_stream(request: web.Request, headers: dict[str, str], gw: Gateway, t: Tracked) -> web.StreamResponse:
    """The stream's response: the one whose headers went out while its model loaded (loading.py),
    now the answer's (an error from here on is the stream's own), or a new one."""
    early = request.pop(loading.EARLY, None)
    if early is not None:
        return early.out
    return stream_response(headers, gw.headers(t))


async def whole_events(ex: Exchange, req: c.Request, matcher: StopMatcher | None,
                       count_prompt: bool = False, turn: Turn | None = None) -> list[c.Event]:
    """The canonical events of a whole answer, its usage folded into the record. Read as a stream
    for the gateway's stop matching, or from a backend that cannot stop a plain generation whose
    client left (config.Backend.streams_upstream: llama.cpp), so that closing it stops the
    generation at its next token."""
    assert ex.backend is not None
    fold = UsageFold(ex.t, ex, first=False)  # no first token to report to a client that waits for it all
    turn = turn or _ChatTurn(req)
    if matcher is None and not ex.backend.cfg.streams_upstream and not turn.upstream_stream_only:
        upstream = await turn.open_upstream(ex, stream=False)
        assert ex.client is not None  # open_upstream set it
        raw = await ex.client.read_all(upstream)
        ex.complete = True
        try:
            events = decode_completion(raw)
        except ValueError as err:  # Malformed, or an error body sent with 200
            kind: ErrorKind = "upstream_malformed" if isinstance(err, Malformed) else "upstream_error"
            raise GatewayError(kind, f"backend {ex.backend.name!r}: {clean_message(str(err))}") from None
        fold.whole(events)
        return events

    async def read() -> list[c.Event]:
        upstream = await turn.open_upstream(ex, stream=True, send_stop=matcher is None, count_prompt=count_prompt)
        ex.t.generating()
        stops = StopMatcher(req.stop) if matcher is not None else None  # each try matches anew
        try:
            return [ev async for events in stream_events(upstream, ex, stops, fold, turn.decoder())
                    for ev in events]
        except Midstream as err:
            if err.kind == "upstream_too_large":  # it answered: too much
                raise GatewayError("upstream_too_large", str(err)) from None
            raise UpstreamFailure("upstream_error", str(err), cause="broke") from None

    return await ex.whole(read)  # a backend that breaks off mid-way fails over: nothing went out


class _ChatTurn(Turn):
    """The default hooks alone, for `whole_events` called without a Turn."""

    def __init__(self, req: c.Request) -> None:
        self.req = req


_COUNT_WAIT_S = 2.0  # at the end of an answer the prompt count has long arrived; if not, no figure


async def _settle_prompt(ex: Exchange, turn: Turn) -> None:
    """An answer that ended without the upstream's prompt count (the gateway stopped it at a stop
    string; llama.cpp and Ollama report usage only at the end) takes the tokenizer's."""
    if turn.count_prompt and ex.t.tokens_in is None:
        prompt = await ex.counted_prompt(_COUNT_WAIT_S)
        if prompt is not None:
            ex.t.tokens_in = prompt


async def _relay(upstream, ex: Exchange, t: Tracked, turn: Turn, enc: StreamEncoder, out, matcher,
                 ping: Callable[[], bytes] | None) -> None:
    # A batch whose events encode to nothing (hidden reasoning) is upstream progress, so the
    # watchdog does not ping: with a ping interval, the client still gets one every interval.
    loop = asyncio.get_running_loop()
    quiet_since: float | None = None
    feed = enc.feed
    fold = UsageFold(t, ex)
    try:
        async for events in stream_events(upstream, ex, matcher, fold, turn.decoder()):
            data = b"".join([feed(ev) for ev in events])
            if data:
                await ex.send(out, data)
                quiet_since = None
            elif ping is not None and ex.ping_interval:
                now = loop.time()
                if quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= ex.ping_interval:
                    await ex.send(out, ping())
                    quiet_since = now
            if enc.ended:
                t.fail("upstream_midstream", override=True)
                return
        await _settle_prompt(ex, turn)
        tail = turn.finish(enc, ex)
        await turn.before_final()
        await out.write(tail)
        t.answered = True
    except Midstream as err:
        t.fail(err.kind, override=True)
        await ex.send(out, enc.fail(turn.midstream_code, str(err)))
    except asyncio.CancelledError:
        own = ex.own_cancel()
        if own is None:
            raise
        raise own from None
