"""surfaces/skeleton.py's optional encoder Protocols. A Turn that asks for keep-alive pings gets
its encoder's `ping` (KeepAliveEncoder); one whose encoder has none is refused loudly, at the
stream's start, not with an AttributeError at the first silent moment. Encoders that carry tool
calls count the argument fragments they drop (ToolCallEncoder), which the skeleton logs."""

from __future__ import annotations

import pytest

from homelab_frontend.surfaces.anthropic.stream import AnthropicStreamEncoder
from homelab_frontend.surfaces.gemini.stream import GeminiStreamEncoder
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.surfaces.skeleton import KeepAliveEncoder, Turn, keep_alive

SIGNER = ThinkingSigner(b"keep-alive")


class _Pinging(Turn):
    ping_interval = 5.0


def test_a_turn_with_pings_gets_its_encoders_ping():
    enc = AnthropicStreamEncoder(message_id="msg_1", model="m", signer=SIGNER)
    assert isinstance(enc, KeepAliveEncoder)
    ping = keep_alive(_Pinging(), enc)
    assert ping is not None and b"event: ping" in ping()


def test_a_turn_without_pings_needs_none():
    enc = GeminiStreamEncoder(model="m", response_id="r", signer=SIGNER, include_thoughts=False)
    assert keep_alive(Turn(), enc) is None


def test_pings_asked_of_an_encoder_without_them_fail_loudly():
    enc = GeminiStreamEncoder(model="m", response_id="r", signer=SIGNER, include_thoughts=False)
    assert not isinstance(enc, KeepAliveEncoder)
    with pytest.raises(TypeError, match="_Pinging sets ping_interval but its encoder GeminiStreamEncoder has no ping"):
        keep_alive(_Pinging(), enc)


def test_every_encoder_that_carries_tool_calls_counts_what_it_drops():
    from homelab_frontend.surfaces.ollama.stream import NdjsonEncoder
    from homelab_frontend.surfaces.responses.stream import ResponsesStreamEncoder
    from homelab_frontend.surfaces.skeleton import ToolCallEncoder

    encoders = [AnthropicStreamEncoder(message_id="msg_1", model="m", signer=SIGNER),
                GeminiStreamEncoder(model="m", response_id="r", signer=SIGNER, include_thoughts=False),
                NdjsonEncoder(model="m")]
    assert all(isinstance(e, ToolCallEncoder) and e.dropped_tool_args == 0 for e in encoders)
    assert "dropped_tool_args" in ResponsesStreamEncoder.__slots__
