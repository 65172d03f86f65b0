"""Canonical events from an open upstream stream, for the surfaces that translate (Anthropic
Messages, OpenAI Responses): one reader, so first-token timing, progress for the watchdog, the
gateway's own stop matching and the "ended without finishing" rule are the same in both."""

from __future__ import annotations

from typing import AsyncIterator, Callable

import aiohttp

from .. import canonical as c
from ..request.exchange import Exchange
from ..upstream.stopmatch import StopMatcher
from ..upstream.decode import ChunkDecoder
from ..upstream.read import UpstreamTooLarge

CONTENT = (c.TextDelta, c.ReasoningDelta, c.ToolCallStart, c.ToolArgsDelta)


class Midstream(Exception):
    """The upstream failed after the answer started."""

    def __init__(self, message: str, kind: str = "upstream_midstream") -> None:
        super().__init__(message)
        self.kind = kind  # the outcome's kind (request/outcome.py)


async def stream_events(
    upstream: aiohttp.ClientResponse, ex: Exchange, matcher: StopMatcher | None,
    on_first: Callable[[], None] | None = None,
) -> AsyncIterator[list[c.Event]]:
    """Batches of canonical events from an upstream SSE body, as they arrive. Ends normally only
    when the upstream finished (`[DONE]`) or a gateway-side stop sequence fired. `on_first` is
    called at the first generated token, whose batch is yielded at once, without the rest of
    what arrived with it."""
    decoder = ChunkDecoder()
    first = True
    try:
        async for batch in ex.client.sse(upstream):
            ex.progress += 1
            events: list[c.Event] = []
            for payload in batch:
                got = decoder.feed(payload)
                if matcher is not None:
                    got = [e2 for e in got for e2 in matcher.feed(e)]
                events.extend(got)
                if first and any(isinstance(e, CONTENT) for e in got):
                    first = False
                    if on_first is not None:
                        on_first()
                    yield events
                    events = []
            if events:
                yield events
            if matcher is not None and matcher.matched is not None:
                return  # the rest of the generation is not wanted: closing the exchange stops it
            if decoder.done:
                ex.complete = True
                return
    except UpstreamTooLarge as err:
        raise Midstream(err.message, "upstream_too_large") from None
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionResetError):
        raise Midstream("the backend closed the connection mid-stream") from None
    raise Midstream("the backend ended the stream without finishing it")


def gateway_stops(req: c.Request, ex: Exchange) -> bool:
    """Upstreams that do not say which stop string fired (Ollama, llama.cpp) get no `stop`; the
    gateway matches the strings itself on the stream and stops the generation when one fires."""
    assert ex.backend is not None
    return bool(req.stop) and not ex.backend.cfg.reports_stop_reason
