"""Responses error rendering: the OpenAI shape with the codes Codex acts on."""

from __future__ import annotations

import json

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.responses.errors import failure_code, render_error


@pytest.mark.parametrize("err", [
    GatewayError("invalid_request", "the prompt is 5000 tokens, and model 'm' has a context of 4096 tokens: no room left to answer", param="messages"),
    GatewayError("upstream_error", "backend 'b' answered 400: This model's maximum context length is 1024 tokens. However, your request has 3141 input tokens.", status=400),
    GatewayError("upstream_error", "backend 'b' answered 400: the request exceeds the available context size, try increasing it", status=400),
])
def test_context_errors(err):
    status, body, _ = render_error(err)
    e = json.loads(body)["error"]
    assert status == 400 and e["code"] == "context_length_exceeded" and e["param"] == "input"
    assert failure_code(err) == "context_length_exceeded"


def test_other_400s_keep_their_code_and_param():
    status, body, _ = render_error(GatewayError("invalid_request", "input[0].type: bad", param="input[0].type"))
    e = json.loads(body)["error"]
    assert (status, e["code"], e["param"]) == (400, "invalid_request", "input[0].type")


def test_overload_says_when_to_try_again():
    status, body, headers = render_error(GatewayError("overloaded", "the queue for backend 'b' is full", retry_after=2.2))
    e = json.loads(body)["error"]
    assert status == 429 and headers["retry-after"] == "3"
    assert e["message"] == "the queue for backend 'b' is full. Please try again in 3s."
    assert failure_code(GatewayError("overloaded", "x")) == "rate_limit_exceeded"
    assert failure_code(GatewayError("timeout", "x")) == "server_error"
