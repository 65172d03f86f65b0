"""Errors answered by the per-request wrapper (app/request_scope.py): the dialect's shape, the
request id and timing headers, and the outcome the record gets."""

from __future__ import annotations

import asyncio
import json

import pytest

from homelab_frontend.app.request_scope import _error_response
from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces.anthropic.errors import render_error as anthropic
from homelab_frontend.surfaces.openai.errors import render_error as openai


def _record() -> Tracked:
    async def make():
        return Tracked("req_l", "openai", "m", None, False)
    return asyncio.run(make())


@pytest.mark.parametrize("kind, outcome", [("overloaded", "rejected_overloaded"), ("rate_limit", "rejected_rate_limit"),
                                           ("invalid_request", "error_invalid_request"),
                                           ("timeout", "error_timeout")])
def test_refusals_before_the_answer_are_rejections(kind, outcome):
    t = _record()
    resp = _error_response(t, GatewayError(kind, "no", retry_after=2 if kind in ("overloaded", "rate_limit") else None),
                           openai)
    assert t.outcome == outcome and t.status == resp.status
    assert resp.headers["request-id"] == "req_l" and "gw;dur=" in resp.headers["server-timing"]


def test_the_dialect_shape():
    t = _record()
    resp = _error_response(t, GatewayError("not_found", "model 'x' not found", param="model"), anthropic)
    body = json.loads(resp.body)
    assert resp.status == 404 and body == {"type": "error", "error": {"type": "not_found_error",
                                                                     "message": "model 'x' not found"}}
    t = _record()
    resp = _error_response(t, GatewayError("not_found", "model 'x' not found", param="model"), openai)
    assert json.loads(resp.body)["error"]["param"] == "model"


def test_an_outcome_already_recorded_is_kept():
    t = _record()
    t.fail("timeout")
    _error_response(t, GatewayError("api_error", "then this"), openai)
    assert t.outcome == "error_timeout"


def test_a_dialect_without_an_error_renderer_is_refused_when_its_route_is_built():
    from homelab_frontend.app.request_scope import RENDERERS, surface

    async def handler(request, gw, t):  # never reached
        raise AssertionError

    with pytest.raises(ValueError, match="surface dialect 'nonesuch' has no error renderer"):
        surface("nonesuch", handler)
    for dialect in RENDERERS:
        assert callable(surface(dialect, handler))

