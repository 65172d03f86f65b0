"""limits.check_json: depth and count limits, their fast paths, and what the errors name."""

from __future__ import annotations

import json

import pytest

from homelab_frontend.config import Limits
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.limits import check_json

L = Limits(max_json_depth=5, max_messages=3, max_tools=2)


def nested(levels: int) -> dict:
    """A body whose `tools[0].input_schema` chain makes it `levels` containers deep in all."""
    schema: dict = {}
    for _ in range(levels - 4):  # body, tools, tools[0], input_schema
        schema = {"a": schema}
    return {"model": "m", "tools": [{"input_schema": schema}]}


def refuse(doc, limits=L) -> GatewayError:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(GatewayError) as info:
        check_json(body, limits)
    assert info.value.kind == "invalid_request" and info.value.status == 400
    return info.value


def test_depth_at_the_limit_passes_one_more_is_refused_naming_the_field():
    check_json(json.dumps(nested(5)).encode(), L)
    err = refuse(nested(6))
    assert err.param == "tools[0].input_schema.a.a"  # the sixth container
    assert err.message == "tools[0].input_schema.a.a: JSON nested more than 5 levels deep (limits.max_json_depth)"


def test_nesting_beyond_the_decoder_is_a_clear_error_not_a_recursion_error():
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
        err = refuse(raw, Limits())
        assert "limits.max_json_depth" in err.message


def test_counts_name_the_field_and_the_limit():
    err = refuse({"messages": [{}] * 4})
    assert err.param == "messages" and err.message == "messages: 4 messages is more than the limit of 3 (limits.max_messages)"
    err = refuse({"tools": [{}] * 3})
    assert err.param == "tools" and "limits.max_tools" in err.message
    check_json(json.dumps({"messages": [{}] * 3, "tools": [{}] * 2}).encode(), L)


def test_a_gemini_requests_contents_are_its_messages():
    with pytest.raises(GatewayError) as e:
        check_json(json.dumps({"contents": [{}] * 4}).encode(), L, counted=("contents",))
    assert e.value.param == "contents"
    assert e.value.message == "contents: 4 contents is more than the limit of 3 (limits.max_messages)"


def test_fast_path_never_hides_a_long_list_of_scalars():
    # no brackets to speak of, but 5 items: the comma count sends it to the full check
    refuse(b'{"messages": [1, 2, 3, 4, 5]}')


def test_not_json_is_left_to_the_surface_parser():
    for raw in (b"", b"{", b"\xff\xfe", b'{"a": NaN}', b"[" * 10):
        check_json(raw, L)


def test_embeddings_style_checks_depth_only():
    check_json(json.dumps({"input": ["x"] * 50}).encode(), L, counted=())
    with pytest.raises(GatewayError):
        check_json(json.dumps(nested(6)).encode(), L, counted=())
