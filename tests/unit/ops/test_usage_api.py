"""ops/usage_api.py: the query of /admin/usage and /llm/v1/usage, read from the URL; bad values
are a 400 naming the parameter (the handlers around it are glue, run by the integration tests)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from homelab_frontend.errors import GatewayError
from homelab_frontend.ops.usage_api import _params


def _q(query: str) -> dict:
    return _params(make_mocked_request("GET", "/admin/usage" + query))


def test_defaults_and_filters():
    assert _q("") == {"key": None, "model": None, "by": "hour"}
    assert _q("?key=alice&model=qwen&by=day") == {"key": "alice", "model": "qwen", "by": "day"}
    assert _q("?key=&model=") == {"key": None, "model": None, "by": "hour"}  # empty is no filter


def test_times_are_parsed():
    got = _q("?since=2026-12-01T00:00:00Z&until=2026-12-02")
    assert got["since"] == 1796083200.0 and got["until"] == 1796169600.0


@pytest.mark.parametrize("query, param", [("?since=yesterday", "since"), ("?until=2026-13-45", "until"),
                                          ("?by=week", "by")])
def test_a_bad_value_is_a_400_naming_its_parameter(query, param):
    with pytest.raises(GatewayError) as e:
        _q(query)
    assert e.value.kind == "invalid_request" and e.value.param == param and e.value.message.startswith(param)
