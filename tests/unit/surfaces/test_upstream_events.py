"""Canonical events from an open upstream stream (surfaces/upstream_events.py), over a real
aiohttp upstream on a loopback port: the first token's batch, the gateway's own
stop matching ending the read, `[DONE]` marking the exchange complete, and every way a stream
can end badly becoming `Midstream` with its outcome kind."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from homelab_frontend import canonical as c
from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.policy.routing import BackendState, Route
from homelab_frontend.request.exchange import Exchange
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces.upstream_events import Midstream, gateway_stops, stream_events
from homelab_frontend.surfaces.usage import UsageFold
from homelab_frontend.upstream.client import UpstreamClient
from homelab_frontend.upstream.stopmatch import StopMatcher


def _chunk(**delta) -> bytes:
    return b"data: " + json.dumps({"object": "chat.completion.chunk",
                                   "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode() + b"\n\n"


FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"
BODIES = {
    "whole": _chunk(role="assistant") + _chunk(content="Hel") + _chunk(content="lo") + FINISH + DONE,
    "stop": _chunk(content="one STOP two") + _chunk(content="three") + FINISH + DONE,
    "unfinished": _chunk(content="Hel"),  # the body ends without [DONE]
    "huge": b"data: " + b"x" * 4096,  # a line longer than max_line_bytes, still open
}


async def _upstream():
    async def chat(request: web.Request) -> web.StreamResponse:
        kind = (await request.json())["kind"]
        out = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await out.prepare(request)
        if kind == "reset":
            await out.write(_chunk(content="Hel"))
            request.transport.abort()  # the connection drops mid-stream
            return out
        await out.write(BODIES[kind])
        return out

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def _run(kind: str, matcher: StopMatcher | None = None, kind_of_backend: str = "vllm"):
    async def main():
        runner, port = await _upstream()
        b = cfgmod.parse({"backends": {"u": {"url": f"http://127.0.0.1:{port}/v1", "kind": kind_of_backend,
                                             "limits": {"max_line_bytes": 1024}}},
                          "models": {"m": {"backend": "u"}}}).backends["u"]
        state = BackendState("u", b, SlotPool("u", 1, 4, 5.0))
        route = Route("m", "m", "m", (state,), None, affinity=False)
        clients = {"u": UpstreamClient("u", b)}
        firsts: list[int] = []
        batches: list[list[c.Event]] = []
        try:
            async with Exchange(Tracked("req_ue", "anthropic", "m", None, True), route, clients) as ex:
                await ex.admit()
                resp = await ex.open("/chat/completions", json.dumps({"kind": kind}).encode(), stream=True)
                try:
                    class _Fold(UsageFold):  # notes which batch held the first token
                        def chunk(self, events):
                            first = super().chunk(events)
                            if first:
                                firsts.append(len(batches))
                            return first

                    async for events in stream_events(resp, ex, matcher, _Fold(ex.t, ex)):
                        batches.append(events)
                    return batches, firsts, ex.complete, ex.progress, None
                except Midstream as err:
                    return batches, firsts, ex.complete, ex.progress, err
        finally:
            await clients["u"].close()
            await runner.cleanup()

    return asyncio.run(main())


def test_a_whole_stream_and_the_first_token():
    batches, firsts, complete, progress, err = _run("whole")
    events = [e for b in batches for e in b]
    assert err is None and complete and progress >= 1
    assert [e.text for e in events if isinstance(e, c.TextDelta)] == ["Hel", "lo"]
    assert events[-1] == c.Finish("stop")
    # the callback ran once, before the batch holding the first token was yielded, and that
    # batch ends at the first token (the rest of what arrived with it comes in the next one)
    assert firsts == [0] and batches[0][-1] == c.TextDelta("Hel")


def test_a_gateway_side_stop_ends_the_read_without_completing_it():
    batches, _, complete, _, err = _run("stop", StopMatcher(["STOP"]))
    events = [e for b in batches for e in b]
    assert err is None and not complete  # the rest is not wanted: closing the exchange stops it
    assert "".join(e.text for e in events if isinstance(e, c.TextDelta)) == "one "
    assert events[-1] == c.Finish("stop_sequence", "STOP")


@pytest.mark.parametrize("kind, outcome", [("unfinished", "upstream_midstream"), ("reset", "upstream_midstream"),
                                           ("huge", "upstream_too_large")])
def test_every_bad_ending_is_midstream_with_its_kind(kind, outcome):
    _, _, complete, _, err = _run(kind)
    assert isinstance(err, Midstream) and err.kind == outcome and not complete


def test_gateway_stops_only_where_the_upstream_cannot_name_the_stop():
    class _Ex:
        def __init__(self, kind):
            self.backend = BackendState("u", cfgmod.parse({"backends": {"u": {"url": "http://x/v1", "kind": kind}},
                                                            "models": {"m": {"backend": "u"}}}).backends["u"],
                                        SlotPool("u", 1, 1, 1.0))

    with_stop = c.Request(model="m", messages=[c.Message("user", [c.TextPart("hi")])], stop=["x"])
    without = c.Request(model="m", messages=[c.Message("user", [c.TextPart("hi")])])
    assert gateway_stops(with_stop, _Ex("llamacpp")) and gateway_stops(with_stop, _Ex("ollama"))
    assert not gateway_stops(with_stop, _Ex("vllm")) and not gateway_stops(without, _Ex("llamacpp"))
