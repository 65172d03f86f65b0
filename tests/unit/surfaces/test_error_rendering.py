"""GatewayError -> Anthropic and OpenAI error responses."""

from __future__ import annotations

import json

import anthropic
import pytest

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.openai import errors as openai_errors
from homelab_frontend.surfaces.anthropic import errors as anthropic_errors


def a_render(err: GatewayError) -> tuple[int, dict, dict]:
    status, body, headers = anthropic_errors.render_error(err)
    assert isinstance(body, bytes)
    return status, json.loads(body), headers


def o_render(err: GatewayError) -> tuple[int, dict, dict]:
    status, body, headers = openai_errors.render_error(err)
    assert isinstance(body, bytes)
    return status, json.loads(body), headers


# ---------------------------------------------------------------------------------------------
# Anthropic
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, status, err_type",
    [
        ("invalid_request", 400, "invalid_request_error"),
        ("authentication", 401, "authentication_error"),
        ("permission", 403, "permission_error"),
        ("not_found", 404, "not_found_error"),
        ("request_too_large", 413, "request_too_large"),
        ("rate_limit", 429, "rate_limit_error"),
        ("overloaded", 529, "overloaded_error"),
        ("upstream_unreachable", 502, "api_error"),
        ("upstream_error", 502, "api_error"),
        ("timeout", 504, "timeout_error"),
        ("api_error", 500, "api_error"),
    ],
)
def test_anthropic_by_kind(kind: str, status: int, err_type: str) -> None:
    got_status, body, headers = a_render(GatewayError(kind, "something failed"))  # type: ignore[arg-type]
    assert got_status == status
    assert body == {"type": "error", "error": {"type": err_type, "message": "something failed"}}
    assert headers == {}


@pytest.mark.parametrize(
    "upstream_status, status, err_type",
    [
        (400, 400, "invalid_request_error"),
        (422, 400, "invalid_request_error"),
        (401, 502, "api_error"),
        (403, 502, "api_error"),
        (404, 404, "not_found_error"),
        (405, 502, "api_error"),
        (408, 504, "timeout_error"),
        (413, 413, "request_too_large"),
        (429, 429, "rate_limit_error"),
        (500, 500, "api_error"),
        (502, 502, "api_error"),
        (503, 503, "overloaded_error"),
        (504, 504, "timeout_error"),
        (529, 529, "overloaded_error"),
        (200, 502, "api_error"),
    ],
)
def test_anthropic_upstream_status_mapping(upstream_status: int, status: int, err_type: str) -> None:
    got_status, body, _ = a_render(GatewayError("upstream_error", "backend said no", status=upstream_status))
    assert (got_status, body["error"]["type"]) == (status, err_type)
    assert body["error"]["message"] == "backend said no"


def test_anthropic_timeout_is_always_504() -> None:
    assert a_render(GatewayError("timeout", "slow", status=500))[0] == 504


def test_anthropic_client_kinds_keep_their_canonical_status() -> None:
    assert a_render(GatewayError("overloaded", "busy", status=503))[0] == 529
    assert a_render(GatewayError("invalid_request", "bad", status=422))[0] == 400


@pytest.mark.parametrize(
    "retry_after, header",
    [(None, None), (0, "1"), (0.2, "1"), (1, "1"), (1.01, "2"), (30, "30"), (29.5, "30"),
     (-5, "1"), (float("inf"), None), (float("nan"), None)],
)
def test_retry_after(retry_after: float | None, header: str | None) -> None:
    err = GatewayError("overloaded", "busy", retry_after=retry_after)
    _, _, headers = a_render(err)
    _, _, o_headers = o_render(err)
    expected = {} if header is None else {"retry-after": header}
    assert headers == expected and o_headers == expected


def test_anthropic_body_is_what_the_sdk_expects() -> None:
    """The official SDK maps our status and body to its typed exception, message intact."""
    import httpx2 as httpx

    cases = [
        (GatewayError("invalid_request", "messages[0].content: bad", param="messages[0].content"),
         anthropic.BadRequestError),
        (GatewayError("authentication", "bad key"), anthropic.AuthenticationError),
        (GatewayError("not_found", "no such model"), anthropic.NotFoundError),
        (GatewayError("rate_limit", "slow down", retry_after=1), anthropic.RateLimitError),
        (GatewayError("overloaded", "busy", retry_after=2), anthropic.InternalServerError),
        (GatewayError("api_error", "oops"), anthropic.InternalServerError),
    ]
    for err, exc_type in cases:
        status, body, headers = anthropic_errors.render_error(err)
        client = anthropic.Anthropic(
            api_key="x", base_url="http://gateway.test", max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(
                lambda request: httpx.Response(status, content=body,
                                               headers={"content-type": "application/json", **headers}))),
        )
        with pytest.raises(exc_type) as info:
            client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "q"}])
        assert info.value.status_code == status
        assert info.value.body["error"]["message"] == err.message  # type: ignore[index]
        assert info.value.body["type"] == "error"  # type: ignore[index]


def test_anthropic_never_leaks_param_or_openai_shape() -> None:
    _, body, _ = a_render(GatewayError("invalid_request", "model: required", param="model"))
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}


def test_empty_message_gets_a_default() -> None:
    _, body, _ = a_render(GatewayError("api_error", ""))
    assert body["error"]["message"]
    _, body, _ = o_render(GatewayError("api_error", ""))
    assert body["error"]["message"]


# ---------------------------------------------------------------------------------------------
# OpenAI
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, status, err_type, code",
    [
        ("invalid_request", 400, "invalid_request_error", "invalid_request"),
        ("authentication", 401, "authentication_error", "invalid_api_key"),
        ("permission", 403, "permission_error", "permission_denied"),
        ("not_found", 404, "not_found_error", "not_found"),
        ("request_too_large", 413, "invalid_request_error", "request_too_large"),
        ("rate_limit", 429, "rate_limit_error", "rate_limit_exceeded"),
        ("overloaded", 429, "rate_limit_error", "overloaded"),
        ("upstream_unreachable", 502, "upstream_error", "upstream_unreachable"),
        ("upstream_error", 502, "upstream_error", "upstream_error"),
        ("timeout", 504, "api_error", "timeout"),
        ("api_error", 500, "api_error", "internal_error"),
    ],
)
def test_openai_by_kind(kind: str, status: int, err_type: str, code: str) -> None:
    got_status, body, headers = o_render(GatewayError(kind, "it failed"))  # type: ignore[arg-type]
    assert got_status == status
    assert body == {"error": {"message": "it failed", "type": err_type, "param": None, "code": code}}
    assert headers == {}


def test_openai_param() -> None:
    _, body, _ = o_render(GatewayError("invalid_request", "messages[1].role: bad", param="messages[1].role"))
    assert body["error"]["param"] == "messages[1].role"


@pytest.mark.parametrize(
    "upstream_status, status, err_type",
    [
        (400, 400, "invalid_request_error"),
        (401, 502, "upstream_error"),
        (404, 404, "not_found_error"),
        (429, 429, "rate_limit_error"),
        (500, 500, "api_error"),
        (503, 503, "api_error"),
        (529, 503, "api_error"),
        (504, 504, "api_error"),
    ],
)
def test_openai_upstream_status_mapping(upstream_status: int, status: int, err_type: str) -> None:
    got_status, body, _ = o_render(GatewayError("upstream_error", "x", status=upstream_status))
    assert (got_status, body["error"]["type"]) == (status, err_type)


def test_openai_overloaded_has_retry_after() -> None:
    status, body, headers = o_render(GatewayError("overloaded", "all slots busy", retry_after=3.2))
    assert status == 429
    assert body["error"]["code"] == "overloaded"
    assert headers == {"retry-after": "4"}


def test_openai_body_is_what_the_sdk_expects() -> None:
    import httpx2 as httpx
    import openai

    err = GatewayError("invalid_request", "messages: must be a non-empty list", param="messages")
    status, body, headers = openai_errors.render_error(err)
    client = openai.OpenAI(
        api_key="x", base_url="http://gateway.test/v1", max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(
            lambda request: httpx.Response(status, content=body, headers={"content-type": "application/json"}))),
    )
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    assert info.value.param == "messages"
    assert info.value.code == "invalid_request"
    assert info.value.type == "invalid_request_error"
