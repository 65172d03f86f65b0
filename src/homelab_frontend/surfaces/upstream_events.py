"""Canonical events from an open upstream stream, for the surfaces that translate (Anthropic
Messages, OpenAI Responses, and every dialect on surfaces/skeleton.py): one reader, so the
record's usage and first token (surfaces/usage.py, folded per upstream chunk), progress for the
watchdog, the gateway's own stop matching and the "ended without finishing" rule are the same in
all of them."""

from __future__ import annotations

from typing import AsyncIterator

import aiohttp

from .. import canonical as c
from ..request.exchange import Exchange
from ..upstream.stopmatch import StopMatcher
from ..upstream.decode import ChunkDecoder
from ..upstream.read import UpstreamTooLarge
from .usage import UsageFold


class Midstream(Exception):
    """The upstream failed after the answer started."""

    def __init__(self, message: str, kind: str = "upstream_midstream") -> None:
        super().__init__(message)
        self.kind = kind  # the outcome's kind (request/outcome.py)


async def stream_events(
    upstream: aiohttp.ClientResponse, ex: Exchange, matcher: StopMatcher | None, fold: UsageFold,
    decoder=None,
) -> AsyncIterator[list[c.Event]]:
    """Batches of canonical events from an upstream SSE body, as they arrive, each chunk's usage
    folded into the record. Ends normally only when the upstream finished (`[DONE]`) or a
    gateway-side stop sequence fired. The batch holding the first generated token is yielded at
    once, without the rest of what arrived with it. `decoder`: a chat ChunkDecoder unless given
    (upstream/text_decode.py decodes legacy completions and llama.cpp's /infill alike)."""
    decoder = ChunkDecoder() if decoder is None else decoder
    assert ex.client is not None  # the exchange is open: `upstream` is its answer
    try:
        async for batch in ex.client.sse(upstream):
            ex.progress += 1
            events: list[c.Event] = []
            for payload in batch:
                got = decoder.feed(payload)
                if matcher is not None:
                    got = [e2 for e in got for e2 in matcher.feed(e)]
                events.extend(got)
                if fold.chunk(got):
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
