"""surfaces/anthropic/handler.py: the Messages dialect's decisions on the skeleton, without
sockets: the estimate of a prompt's size before the upstream says it (image data left out), the
error code of the gateway's own failure, and the usage of an answer the gateway stopped itself
(its own figures, never null), streamed or whole."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces.anthropic.handler import _estimated_input_tokens, _Message
from homelab_frontend.surfaces.anthropic.stream import AnthropicStreamEncoder


def _req(*parts: c.Part) -> c.Request:
    return c.Request(model="claude", messages=[c.Message(role="user", parts=list(parts))])


@given(st.binary(max_size=400), st.text(max_size=300))
def test_the_estimate_is_a_quarter_of_the_body_without_the_image_data_and_never_zero(body, url):
    req = _req(c.TextPart(text="hi"), c.ImagePart(url=url)) if url else _req(c.TextPart(text="hi"))
    est = _estimated_input_tokens(body, req)
    assert est >= 1
    assert est == max(1, (len(body) - len(url)) // 4)


def test_an_image_does_not_count_as_prompt_text():
    data = "data:image/png;base64," + "A" * 4000
    body = json.dumps({"messages": [{"role": "user", "content": [{"type": "image", "source": data}]}]}).encode()
    assert _estimated_input_tokens(body, _req(c.ImagePart(url=data))) < 100


def _turn(body: bytes = b"x" * 40) -> _Message:
    gw = SimpleNamespace(signer=None, cfg=SimpleNamespace(anthropic=SimpleNamespace(ping_interval_s=7.5)))
    front = SimpleNamespace(parsed=_req(c.TextPart(text="hi")), body=body)
    return _Message(front, gw)


def test_pings_at_the_configured_interval_and_a_prompt_count_asked_for():
    turn = _turn()
    assert turn.ping_interval == 7.5 and turn.count_prompt


def test_the_gateways_own_timeout_is_a_timeout_error_and_anything_else_an_api_error():
    turn = _turn()
    assert turn.own_failure_code(GatewayError("timeout", "slow")) == "timeout_error"
    assert turn.own_failure_code(GatewayError("api_error", "cancelled by an operator")) == "api_error"


def _ex(tokens_in: int | None, tokens_out: int):
    async def make():
        t = Tracked("req_a", "anthropic", "claude", None, True)
        t.tokens_in, t.tokens_out = tokens_in, tokens_out
        return SimpleNamespace(t=t)
    return asyncio.run(make())


def test_a_whole_answer_the_gateway_stopped_says_its_own_counts_and_estimates_an_unknown_prompt():
    turn = _turn(body=b"x" * 400)
    ex = _ex(None, 3)
    result = turn.whole([c.TextDelta(text="one"), c.Finish(reason="stop", stop_sequence="STOP")], ex)
    assert result["usage"]["output_tokens"] == 3
    assert result["usage"]["input_tokens"] == 100 == ex.t.tokens_in  # the estimate, kept in the record


def test_a_whole_answer_keeps_the_upstreams_counts_when_it_reported_them():
    turn = _turn()
    result = turn.whole([c.TextDelta(text="one"), c.Usage(input_tokens=11, output_tokens=1),
                         c.Finish(reason="stop")], _ex(11, 1))
    assert (result["usage"]["input_tokens"], result["usage"]["output_tokens"]) == (11, 1)


def _frames(data: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]


def test_a_stream_the_gateway_stopped_ends_with_the_records_counts_in_message_delta():
    turn = _turn()
    enc = AnthropicStreamEncoder(message_id="msg_1", model="claude", signer=None, input_tokens=lambda: 5)
    enc.feed(c.TextDelta(text="one"))
    enc.feed(c.Finish(reason="stop", stop_sequence="STOP"))
    tail = turn.finish(enc, _ex(9, 4))
    delta = [f for f in _frames(tail) if f["type"] == "message_delta"]
    assert delta and delta[0]["usage"]["output_tokens"] == 4
