"""surfaces/skeleton.py: the decisions of the one request cycle, without sockets. The upstream,
the exchange and the client's connection are small fakes; the Turns and encoders are the
dialect's parts as a dialect would write them. What is checked: which path a whole answer takes
(a plain upstream answer, or a stream folded whole), how a bad whole body becomes an error, the
stream's relay (frames, the final frames after `before_final`, an in-band failure, a failure
mid-stream, pings while the upstream's deltas encode to nothing, the gateway's own cancel) and
keep-alives asked of an encoder that has none."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces import skeleton
from homelab_frontend.surfaces.skeleton import Turn, answer, keep_alive, whole_events
from homelab_frontend.upstream.client import UpstreamFailure


def _chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None,
           reasoning: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    body: dict = {"object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body).encode()


DONE = b"[DONE]"
WHOLE = json.dumps({"object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 2}}).encode()


class _Client:
    """The upstream client: a whole body, or the SSE payloads in batches (as they arrived)."""

    def __init__(self, body: bytes = b"", batches: list[list[bytes]] | None = None) -> None:
        self.body = body
        self.batches = batches or []

    async def read_all(self, upstream) -> bytes:
        return self.body

    async def sse(self, upstream):
        for batch in self.batches:
            yield batch


class _Exchange:
    """What of request.exchange.Exchange the skeleton calls."""

    def __init__(self, client: _Client, *, streams_upstream: bool = False, reports_stop_reason: bool = True,
                 own_cancel: GatewayError | None = None) -> None:
        self.t = Tracked("req_sk", "test", "m", None, True)
        self.t.connecting()  # the slot held, as request.exchange has it before the upstream is asked
        self.client = client
        self.backend = SimpleNamespace(name="b", cfg=SimpleNamespace(streams_upstream=streams_upstream,
                                                                     reports_stop_reason=reports_stop_reason))
        self.progress = 0
        self.complete = False
        self.ping_interval: float | None = None
        self.on_idle = None
        self.firsts = 0
        self.drained = False
        self._own_cancel = own_cancel

    def first_token(self) -> None:
        self.firsts += 1

    async def whole(self, read):
        return await read()

    async def send(self, out, data: bytes) -> None:
        await out.write(data)

    async def drain(self) -> None:
        self.drained = True

    def own_cancel(self):
        return self._own_cancel

    async def counted_prompt(self, wait: float):
        return None


class _Out:
    """The client's side of a stream: what was written, in order."""

    def __init__(self, log: list | None = None) -> None:
        self.log = log if log is not None else []

    async def write(self, data: bytes) -> None:
        self.log.append(data)

    def bytes(self) -> bytes:
        return b"".join(d for d in self.log if isinstance(d, bytes))


class _Encoder:
    """A dialect's stream grammar in miniature: a text delta is a frame, the rest nothing."""

    def __init__(self) -> None:
        self.ended = False
        self.failed: tuple[str, str] | None = None

    def feed(self, ev: c.Event) -> bytes:
        if isinstance(ev, c.TextDelta):
            if ev.text == "BOOM":  # an in-band failure: a terminal frame
                self.ended = True
                return b"[failed]"
            return f"<{ev.text}>".encode()
        return b""

    def finish(self) -> bytes:
        return b"[end]"

    def fail(self, code: str, message: str) -> bytes:
        self.failed = (code, message)
        return f"[fail {code}]".encode()


class _PingEncoder(_Encoder):
    def ping(self) -> bytes:
        return b"[ping]"


class _Turn(Turn):
    def __init__(self, req: c.Request, enc=None, *, ping_interval: float | None = None, log: list | None = None,
                 stream_only: bool = False) -> None:
        self.req = req
        self._enc = enc if enc is not None else _Encoder()
        self.ping_interval = ping_interval
        self.log = log if log is not None else []
        self.opened: list[dict] = []
        if stream_only:
            self.upstream_stream_only = True

    async def open_upstream(self, ex, *, stream, continuous_usage=False, send_stop=True, count_prompt=False):
        self.opened.append({"stream": stream, "send_stop": send_stop})
        return object()

    def encoder(self):
        return self._enc

    def whole(self, events, ex):
        return {"text": "".join(e.text for e in events if isinstance(e, c.TextDelta))}

    async def before_final(self) -> None:
        self.log.append("before_final")


def _req(stream: bool = False, stop: list[str] | None = None) -> c.Request:
    return c.Request(model="m", messages=[c.Message(role="user", parts=[c.TextPart(text="hi")])], stream=stream, stop=stop or [])


def _run(coro):
    return asyncio.run(coro)


# -- keep-alives --------------------------------------------------------------------------------

def test_keep_alive_is_the_encoders_ping_only_when_the_turn_asks_for_pings():
    enc = _PingEncoder()
    assert keep_alive(_Turn(_req()), enc) is None
    ping = keep_alive(_Turn(_req(), ping_interval=5.0), enc)
    assert ping is not None and ping() == b"[ping]"


def test_a_turn_asking_for_pings_of_an_encoder_without_them_is_refused():
    with pytest.raises(TypeError, match="no ping"):
        keep_alive(_Turn(_req(), ping_interval=5.0), _Encoder())


# -- a whole answer: which path ----------------------------------------------------------------

def test_a_whole_answer_from_a_backend_that_can_stop_is_one_plain_upstream_answer():
    async def main():
        ex = _Exchange(_Client(body=WHOLE))
        turn = _Turn(_req())
        events = await whole_events(ex, turn.req, None, turn=turn)
        return ex, turn, events

    ex, turn, events = _run(main())
    assert turn.opened == [{"stream": False, "send_stop": True}]
    assert [e.text for e in events if isinstance(e, c.TextDelta)] == ["Hello"]
    assert ex.complete
    assert (ex.t.tokens_in, ex.t.tokens_out) == (7, 2)
    assert ex.firsts == 0  # a client waiting for the whole answer has no first token


@pytest.mark.parametrize("why", ["streams_upstream", "stream_only", "gateway_stops"])
def test_a_whole_answer_is_folded_from_a_stream_when_closing_it_must_stop_the_generation(why):
    batches = [[_chunk("Hel")], [_chunk("lo"), _chunk(None, "stop")], [DONE]]

    async def main():
        ex = _Exchange(_Client(batches=batches), streams_upstream=why == "streams_upstream")
        turn = _Turn(_req(stop=["ZZZ"] if why == "gateway_stops" else None), stream_only=why == "stream_only")
        matcher = skeleton.StopMatcher(turn.req.stop) if why == "gateway_stops" else None
        events = await whole_events(ex, turn.req, matcher, turn=turn)
        return ex, turn, events

    ex, turn, events = _run(main())
    # the stop strings go upstream unless the gateway matches them itself
    assert turn.opened == [{"stream": True, "send_stop": why != "gateway_stops"}]
    assert "".join(e.text for e in events if isinstance(e, c.TextDelta)) == "Hello"
    assert ex.complete and ex.t.tokens_out == 2


def test_the_gateways_stop_match_ends_a_whole_answer_at_the_stop_string():
    batches = [[_chunk("one STOP two")], [_chunk("three")], [_chunk(None, "stop")], [DONE]]

    async def main():
        ex = _Exchange(_Client(batches=batches), reports_stop_reason=False)
        turn = _Turn(_req(stop=["STOP"]))
        return await whole_events(ex, turn.req, skeleton.StopMatcher(["STOP"]), turn=turn)

    events = _run(main())
    assert "".join(e.text for e in events if isinstance(e, c.TextDelta)) == "one "
    assert any(isinstance(e, c.Finish) and e.stop_sequence == "STOP" for e in events)


@pytest.mark.parametrize("body, kind", [(b"not json", "upstream_malformed"),
                                        (b'{"error": {"message": "model exploded"}}', "upstream_error")])
def test_a_bad_plain_answer_is_a_gateway_error_naming_the_backend(body, kind):
    async def main():
        turn = _Turn(_req())
        return await whole_events(_Exchange(_Client(body=body)), turn.req, None, turn=turn)

    with pytest.raises(GatewayError) as got:
        _run(main())
    assert got.value.kind == kind
    assert "'b'" in got.value.message


def test_a_stream_broken_off_before_a_whole_answer_is_a_failure_that_fails_over():
    async def main():
        ex = _Exchange(_Client(batches=[[_chunk("Hel")]]), streams_upstream=True)  # no [DONE]
        turn = _Turn(_req())
        return await whole_events(ex, turn.req, None, turn=turn)

    with pytest.raises(UpstreamFailure) as got:
        _run(main())
    assert got.value.cause == "broke"


# -- a stream: the relay -----------------------------------------------------------------------

def _relay(batches, turn: _Turn, make_ex=None, ping=None, matcher=None):
    async def main():  # a Tracked is made on the loop
        e = make_ex() if make_ex else _Exchange(_Client(batches=batches))
        out = _Out(turn.log)
        await skeleton._relay(object(), e, e.t, turn, turn._enc, out, matcher, ping)
        return e, out

    return _run(main())


def test_a_streamed_answer_is_its_frames_then_before_final_then_the_final_frames():
    turn = _Turn(_req(stream=True))
    ex, out = _relay([[_chunk("Hel")], [_chunk("lo")], [_chunk(None, "stop"), DONE]], turn)
    assert turn.log == [b"<Hel>", b"<lo>", "before_final", b"[end]"]
    assert ex.t.outcome == "ok" and ex.firsts == 1 and ex.complete


def test_a_stream_the_upstream_breaks_off_ends_with_the_dialects_midstream_failure():
    turn = _Turn(_req(stream=True))
    turn.midstream_code = "overloaded_error"
    ex, out = _relay([[_chunk("Hel")]], turn)
    assert out.bytes() == b"<Hel>[fail overloaded_error]"
    assert "before_final" not in turn.log
    assert ex.t.outcome == "error_upstream_midstream"


def test_an_in_band_failure_the_encoder_wrote_ends_the_stream_there():
    turn = _Turn(_req(stream=True))
    ex, out = _relay([[_chunk("a")], [_chunk("BOOM")], [_chunk("never")], [DONE]], turn)
    assert out.bytes() == b"<a>[failed]"
    assert turn._enc.failed is None  # nothing after the terminal frame
    assert ex.t.outcome == "error_upstream_midstream"


def test_batches_that_encode_to_nothing_get_a_ping_each_ping_interval():
    """Hidden reasoning: the upstream progresses, the client sees nothing; with a ping interval,
    a ping goes out each interval of such silence (on a clock the test moves)."""
    clock = iter([0.0, 4.0, 5.0, 6.0, 10.0, 10.5])
    reads: list[float] = []

    def now() -> float:
        reads.append(next(clock, 10.5))
        return reads[-1]

    enc = _PingEncoder()
    turn = _Turn(_req(stream=True), enc, ping_interval=5.0)

    async def main():
        ex = _Exchange(_Client(batches=[[_chunk(reasoning="r")]] * 6 + [[_chunk("x")], [_chunk(None, "stop"), DONE]]))
        ex.ping_interval = 5.0
        loop = asyncio.get_running_loop()
        loop.time = now  # nothing in the relay suspends: only it reads the clock
        try:
            out = _Out(turn.log)
            await skeleton._relay(object(), ex, ex.t, turn, enc, out, None, enc.ping)
        finally:
            del loop.time
        return out

    out = _run(main())
    # quiet from 0.0: 5.0 is an interval (ping), 10.0 another (ping), 10.5 is not
    assert out.log == [b"[ping]", b"[ping]", b"<x>", "before_final", b"[end]"], reads


def test_without_a_ping_silent_batches_write_nothing():
    turn = _Turn(_req(stream=True))
    ex, out = _relay([[_chunk(reasoning="r")]] * 3 + [[_chunk(None, "stop"), DONE]], turn)
    assert turn.log == ["before_final", b"[end]"]


def test_a_cancel_of_the_gateways_own_becomes_its_error_and_the_clients_leaving_stays_a_cancel():
    class _Cancelled(_Client):
        async def sse(self, upstream):
            yield [_chunk("a")]
            raise asyncio.CancelledError

    own = GatewayError("timeout", "too slow")
    with pytest.raises(GatewayError) as got:
        _relay(None, _Turn(_req(stream=True)), lambda: _Exchange(_Cancelled(), own_cancel=own))
    assert got.value is own
    with pytest.raises(asyncio.CancelledError):
        _relay(None, _Turn(_req(stream=True)), lambda: _Exchange(_Cancelled()))


@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=8))
def test_every_delta_reaches_the_client_in_order_once(texts):
    turn = _Turn(_req(stream=True))
    batches = [[_chunk(t)] for t in texts] + [[_chunk(None, "stop"), DONE]]
    ex, out = _relay(batches, turn)
    assert out.bytes() == b"".join(f"<{t}>".encode() for t in texts) + b"[end]"
    assert ex.t.tokens_out == len(texts)


# -- answer(): whole vs stream over a request that is no socket ---------------------------------

class _Gateway:
    def headers(self, t) -> dict[str, str]:
        return {"x-request-id": t.id}


def _request(buf: bytearray):
    wire = mock.Mock()
    wire.write = mock.AsyncMock(side_effect=lambda data, *a, **k: buf.extend(data))
    wire.write_eof = mock.AsyncMock(side_effect=lambda data=b"", *a, **k: buf.extend(data))
    wire.write_headers = mock.AsyncMock()
    wire.drain = mock.AsyncMock()
    return make_mocked_request("POST", "/x", writer=wire), wire


def test_answer_writes_a_whole_json_body_when_the_client_did_not_ask_to_stream():
    async def main():
        buf = bytearray()
        request, wire = _request(buf)
        ex = _Exchange(_Client(body=WHOLE))
        turn = _Turn(_req(stream=False))
        resp = await answer(request, _Gateway(), ex.t, ex, turn)
        return resp, bytes(buf), turn

    resp, body, turn = _run(main())
    assert resp.content_type == "application/json" and resp.headers["x-request-id"] == "req_sk"
    assert json.loads(body) == {"text": "Hello"}
    assert turn.log == ["before_final"]


def test_answer_streams_with_the_turns_headers_and_drains_the_upstream():
    async def main():
        buf = bytearray()
        request, wire = _request(buf)
        ex = _Exchange(_Client(batches=[[_chunk("Hi")], [_chunk(None, "stop"), DONE]]))
        turn = _Turn(_req(stream=True))
        resp = await answer(request, _Gateway(), ex.t, ex, turn)
        return resp, bytes(buf), ex, turn

    resp, body, ex, turn = _run(main())
    assert resp.headers["content-type"] == "text/event-stream"
    assert body == b"<Hi>[end]"
    assert turn.opened == [{"stream": True, "send_stop": True}]
    assert ex.drained


def test_answer_writes_the_gateways_own_failure_in_the_turns_code_and_records_it():
    class _Cancelled(_Client):
        async def sse(self, upstream):
            yield [_chunk("a")]
            raise asyncio.CancelledError

    class _TimeoutTurn(_Turn):
        def own_failure_code(self, err):
            return f"own_{err.kind}"

    async def main():
        buf = bytearray()
        request, wire = _request(buf)
        ex = _Exchange(_Cancelled(), own_cancel=GatewayError("timeout", "too slow"))
        turn = _TimeoutTurn(_req(stream=True))
        await answer(request, _Gateway(), ex.t, ex, turn)
        return bytes(buf), ex, turn

    body, ex, turn = _run(main())
    assert b"[fail own_timeout]" in body
    assert turn._enc.failed == ("own_timeout", "too slow")
    assert ex.t.outcome.startswith("error_timeout")
