"""`GatewayError` -> a Google API error response: (status, body, extra headers). Pure.

Body: `{"error": {"code": <HTTP status>, "message": ..., "status": <google.rpc.Code name>}}`, the
shape both GenAI SDKs parse into their `APIError` (and Gemini CLI classifies by `code`), plus
`details` where Google puts them:

* a field error (`param` set): a `google.rpc.BadRequest` with the one `fieldViolations` entry;
* a refusal that carries a Retry-After: a `google.rpc.RetryInfo` with `retryDelay` ("5s"), and
  the `retry-after` header. Gemini CLI times its retry of a 429 / 503 by that RetryInfo (with
  none it backs off from 5 s, doubling, up to 10 attempts), so a busy gateway tells it when.

    kind                  status  google status
    invalid_request       400     INVALID_ARGUMENT
    authentication        401     UNAUTHENTICATED
    permission            403     PERMISSION_DENIED
    not_found             404     NOT_FOUND
    request_too_large     413     INVALID_ARGUMENT (Google answers an oversized request that way)
    rate_limit            429     RESOURCE_EXHAUSTED (the key's own max_concurrent)
    overloaded            429     RESOURCE_EXHAUSTED (the queue is full, or the wait too long);
                          503     UNAVAILABLE when the error says 503 (shutting down, cancelled)
    backend_down          503     UNAVAILABLE
    api_error             500     INTERNAL
    upstream kinds        the upstream's status, normalised by error_status.upstream_client_status:
                          400 INVALID_ARGUMENT, 404 NOT_FOUND, 413 INVALID_ARGUMENT,
                          429 RESOURCE_EXHAUSTED, 501 UNIMPLEMENTED, 502/503 UNAVAILABLE
                          (529 is sent as 503), 504 DEADLINE_EXCEEDED, other 5xx INTERNAL.

After a stream has started, errors go out through stream.py's `fail()`, not through here.
"""

from __future__ import annotations

import msgspec

from ...errors import GatewayError
from ..error_status import UPSTREAM_KINDS, retry_after_headers, upstream_client_status

__all__ = ["HTTP_STATUS", "render_error", "status_for", "error_body"]

_BY_KIND: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "INVALID_ARGUMENT"),
    "authentication": (401, "UNAUTHENTICATED"),
    "permission": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
    "request_too_large": (413, "INVALID_ARGUMENT"),
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "overloaded": (429, "RESOURCE_EXHAUSTED"),
    "backend_down": (503, "UNAVAILABLE"),
    "api_error": (500, "INTERNAL"),
}

# google.rpc.Code name -> the HTTP status Google sends it with: the one table of both directions
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}

# and back, for an upstream's status, with the two Google has no code of its own for
_BY_STATUS: dict[int, str] = {code: name for name, code in HTTP_STATUS.items()} | {
    413: "INVALID_ARGUMENT",
    502: "UNAVAILABLE",
}


def status_for(err: GatewayError) -> tuple[int, str]:
    """(HTTP status, Google status name) for a GatewayError."""
    if err.kind in UPSTREAM_KINDS:
        status = upstream_client_status(err)
        return status, _BY_STATUS.get(status, "INTERNAL")
    if err.kind == "overloaded" and err.status == 503:
        return 503, "UNAVAILABLE"
    return _BY_KIND.get(err.kind, (500, "INTERNAL"))


def error_body(code: int, status: str, message: str, *, field: str | None = None,
               retry_delay: str | None = None) -> dict:
    error: dict = {"code": code, "message": message, "status": status}
    details = []
    if field:
        details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"field": field, "description": message}]})
    if retry_delay:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
    if details:
        error["details"] = details
    return {"error": error}


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    code, status = status_for(err)
    message = str(err.message) if err.message else status.replace("_", " ").lower()
    headers = retry_after_headers(err)
    delay = headers.get("retry-after")
    body = error_body(code, status, message, field=err.param if code == 400 else None,
                      retry_delay=f"{delay}s" if delay and code in (429, 503) else None)
    return code, msgspec.json.encode(body), headers
