"""surfaces/body.py: the JSON object a body must be, or a 400 saying why."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.body import decode_object


def test_an_object_is_returned():
    assert decode_object(b'{"model": "m", "n": [1]}') == {"model": "m", "n": [1]}


@pytest.mark.parametrize("body, message", [
    (b"", "not valid JSON"),
    (b"{", "not valid JSON"),
    (b"\xff", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"text"', "must be a JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON"),
])
def test_everything_else_is_a_400(body, message):
    with pytest.raises(GatewayError) as e:
        decode_object(body)
    assert e.value.kind == "invalid_request" and message in e.value.message
