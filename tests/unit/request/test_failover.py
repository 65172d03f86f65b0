"""Which failures fail over (request/failover.py)."""

from __future__ import annotations

import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.request.failover import CONNECTION_CAUSES, cause_of
from homelab_frontend.upstream.client import UpstreamFailure


def _status(code: int, text: str = "stub error") -> UpstreamFailure:
    return UpstreamFailure("upstream_error", f"backend 'gpu0' answered {code}: {text}", cause="status",
                           upstream_status=code, status=code)


@pytest.mark.parametrize("code", [429, 502, 503, 504])
def test_not_now_statuses_fail_over(code):
    assert cause_of(_status(code)) == f"status_{code}"


@pytest.mark.parametrize("text", [
    'model "qwen3:8b" not found, try pulling it first',  # Ollama
    "The model `org/big` does not exist.",  # vLLM
    "model is not loaded",
    "Loading model",  # llama.cpp (a 503 anyway)
])
def test_a_model_not_there_fails_over(text):
    assert cause_of(_status(404, text)) == "model_not_loaded"
    assert cause_of(_status(400, text)) == "model_not_loaded"


@pytest.mark.parametrize("code,text", [
    (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"),
    (400, "messages: field required"), (401, "invalid api key"), (403, "forbidden"), (404, "no such route"),
    (413, "too large"), (422, "unprocessable"), (500, "internal error"), (501, "not implemented"),
])
def test_a_refusal_about_the_request_does_not(code, text):
    assert cause_of(_status(code, text)) is None


def test_connection_causes_and_the_gateways_own_errors():
    for cause in ("unreachable", "connect_timeout", "reset"):
        assert cause_of(UpstreamFailure("upstream_unreachable", "x", cause=cause)) == cause
        assert cause in CONNECTION_CAUSES
    assert cause_of(GatewayError("timeout", "no first token")) is None
    assert cause_of(GatewayError("upstream_malformed", "not a chat completion")) is None
