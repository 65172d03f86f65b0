"""`GatewayError` -> an Anthropic error response: (status, body, extra headers). Pure.

Body: `{"type": "error", "error": {"type": ..., "message": ...}}`; the message is the error's own
text (never a stack trace). Extra headers: `retry-after` (whole seconds, rounded up, >= 1) when the
error carries one; the caller adds `content-type` and `request-id`.

    kind                  status  error.type
    invalid_request       400     invalid_request_error
    authentication        401     authentication_error
    permission            403     permission_error
    not_found             404     not_found_error
    request_too_large     413     request_too_large
    rate_limit            429     rate_limit_error
    overloaded            529     overloaded_error
    api_error             500     api_error
    backend_down          503     backend_down_error (its health probe failed; Retry-After: the probe
                                  interval). Not overloaded_error: it is down, not busy.
    upstream_unreachable, \\
    upstream_too_large,    |
    upstream_malformed,    |
    upstream_error,        >      the upstream's status, normalised by
    timeout               /       `error_status.upstream_client_status`, typed by status:
                                  400 invalid_request_error, 404 not_found_error,
                                  413 request_too_large, 429 rate_limit_error,
                                  503/529 overloaded_error, 504 timeout_error (the Anthropic SDK's
                                  GatewayTimeoutError type), any other 5xx api_error.

After a stream has started, errors go out as an `event: error` frame (stream.py), not through here.
"""

from __future__ import annotations

import msgspec

from ...errors import GatewayError
from ..error_status import UPSTREAM_KINDS, retry_after_headers, upstream_client_status

__all__ = ["render_error", "error_type_for"]

_BY_KIND: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "authentication": (401, "authentication_error"),
    "permission": (403, "permission_error"),
    "not_found": (404, "not_found_error"),
    "request_too_large": (413, "request_too_large"),
    "rate_limit": (429, "rate_limit_error"),
    "overloaded": (529, "overloaded_error"),
    "api_error": (500, "api_error"),
    "backend_down": (503, "backend_down_error"),
}

_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
    504: "timeout_error",
}


def error_type_for(err: GatewayError) -> tuple[int, str]:
    """(HTTP status, Anthropic `error.type`) for a GatewayError."""
    if err.kind in UPSTREAM_KINDS:
        status = upstream_client_status(err, keep_529=True)
        return status, _BY_STATUS.get(status, "api_error")
    return _BY_KIND.get(err.kind, (500, "api_error"))


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    status, err_type = error_type_for(err)
    message = str(err.message) if err.message else err_type.replace("_", " ")
    body = msgspec.json.encode({"type": "error", "error": {"type": err_type, "message": message}})
    return status, body, retry_after_headers(err)
