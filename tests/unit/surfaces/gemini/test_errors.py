"""Gemini error rendering: Google's error shape, the status names, Retry-After and RetryInfo,
and what the google-genai SDK makes of each body."""

from __future__ import annotations

import json

import httpx2
import pytest
from google.genai import errors as genai_errors

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.gemini.errors import render_error


@pytest.mark.parametrize("err,code,status", [
    (GatewayError("invalid_request", "x", param="generationConfig.topK"), 400, "INVALID_ARGUMENT"),
    (GatewayError("authentication", "invalid API key"), 401, "UNAUTHENTICATED"),
    (GatewayError("permission", "no"), 403, "PERMISSION_DENIED"),
    (GatewayError("not_found", "no such model"), 404, "NOT_FOUND"),
    (GatewayError("request_too_large", "big"), 413, "INVALID_ARGUMENT"),
    (GatewayError("rate_limit", "busy key", retry_after=1), 429, "RESOURCE_EXHAUSTED"),
    (GatewayError("overloaded", "queue full", retry_after=4.2), 429, "RESOURCE_EXHAUSTED"),
    (GatewayError("overloaded", "shutting down", status=503, retry_after=5), 503, "UNAVAILABLE"),
    (GatewayError("backend_down", "down", retry_after=10), 503, "UNAVAILABLE"),
    (GatewayError("api_error", "ours"), 500, "INTERNAL"),
    (GatewayError("timeout", "slow"), 504, "DEADLINE_EXCEEDED"),
    (GatewayError("upstream_error", "ctx", status=400), 400, "INVALID_ARGUMENT"),
    (GatewayError("upstream_error", "busy", status=529), 503, "UNAVAILABLE"),
    (GatewayError("upstream_unreachable", "refused"), 502, "UNAVAILABLE"),
    (GatewayError("upstream_error", "oops", status=401), 502, "UNAVAILABLE"),
    (GatewayError("upstream_error", "teapot", status=500), 500, "INTERNAL"),
])
def test_status_table_and_the_sdk_reads_it(err, code, status):
    http, body, headers = render_error(err)
    doc = json.loads(body)
    assert http == code and doc["error"]["code"] == code and doc["error"]["status"] == status
    assert doc["error"]["message"] == err.message
    sdk = genai_errors.APIError.raise_for_response  # the SDK's own reading of an error response
    with pytest.raises(genai_errors.APIError) as info:
        sdk(httpx2.Response(http, content=body, headers={"content-type": "application/json", **headers}))
    assert info.value.code == code and info.value.status == status and info.value.message == err.message


def test_retry_after_header_and_retry_info():
    _, body, headers = render_error(GatewayError("overloaded", "queue full", retry_after=4.2))
    assert headers == {"retry-after": "5"}
    assert json.loads(body)["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"}]


def test_a_field_error_carries_a_bad_request_detail():
    _, body, _ = render_error(GatewayError("invalid_request", "generationConfig.topK: expected an integer", param="generationConfig.topK"))
    (detail,) = json.loads(body)["error"]["details"]
    assert detail["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert detail["fieldViolations"][0]["field"] == "generationConfig.topK"
    _, body, _ = render_error(GatewayError("not_found", "no"))
    assert "details" not in json.loads(body)["error"]


def test_one_status_table_both_ways():
    """The stream's error line and the HTTP error read the same google.rpc.Code <-> HTTP table."""
    from homelab_frontend.surfaces.gemini.errors import HTTP_STATUS, _BY_STATUS
    from homelab_frontend.surfaces.gemini.stream import GeminiStreamEncoder
    from homelab_frontend.surfaces.signature import ThinkingSigner

    for name, code in HTTP_STATUS.items():
        assert _BY_STATUS[code] == name
        enc = GeminiStreamEncoder(model="m", response_id="r", signer=ThinkingSigner(b"k" * 32), include_thoughts=False)
        assert json.loads(enc.fail(name, "x"))["error"]["code"] == code
