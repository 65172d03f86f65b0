"""`GatewayError` -> an OpenAI error response: (status, body, extra headers). Pure.

Body: `{"error": {"message", "type", "param", "code"}}`; `param` is the offending field path
(`err.param`, else null), `code` a short stable string. Extra headers: `retry-after` (whole
seconds, rounded up, >= 1) when the error carries one.

    kind                  status  type                   code
    invalid_request       400     invalid_request_error  invalid_request
    authentication        401     authentication_error   invalid_api_key
    permission            403     permission_error       permission_denied
    not_found             404     not_found_error        not_found
    request_too_large     413     invalid_request_error  request_too_large
    rate_limit            429     rate_limit_error       rate_limit_exceeded
    overloaded            429     rate_limit_error       overloaded   (OpenAI has no 529; its SDKs
                                                                      back off and retry on 429)
    api_error             500     api_error              internal_error
    backend_down          503     server_error           backend_down (its health probe failed;
                                                                      Retry-After: the probe interval)
    upstream kinds        the upstream's status normalised by `error_status.upstream_client_status`:
                          400 invalid_request_error, 404 not_found_error, 413 invalid_request_error,
                          429 rate_limit_error, 502 upstream_error (code upstream_error, or
                          upstream_unreachable / upstream_too_large / upstream_malformed by kind),
                          504 api_error (code timeout),
                          503 and 529 -> 503 api_error (code upstream_overloaded), other 5xx api_error.
"""

from __future__ import annotations

import msgspec

from ...errors import GatewayError
from ..error_status import UPSTREAM_KINDS, retry_after_headers, upstream_client_status

__all__ = ["render_error"]

_BY_KIND: dict[str, tuple[int, str, str]] = {
    "invalid_request": (400, "invalid_request_error", "invalid_request"),
    "authentication": (401, "authentication_error", "invalid_api_key"),
    "permission": (403, "permission_error", "permission_denied"),
    "not_found": (404, "not_found_error", "not_found"),
    "request_too_large": (413, "invalid_request_error", "request_too_large"),
    "rate_limit": (429, "rate_limit_error", "rate_limit_exceeded"),
    "overloaded": (429, "rate_limit_error", "overloaded"),
    "api_error": (500, "api_error", "internal_error"),
    "backend_down": (503, "server_error", "backend_down"),
}

_UPSTREAM_BY_STATUS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "upstream_invalid_request"),
    404: ("not_found_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "upstream_rate_limited"),
    503: ("api_error", "upstream_overloaded"),
    504: ("api_error", "timeout"),
}


_OWN_CODE = frozenset({"upstream_unreachable", "upstream_too_large", "upstream_malformed"})


def _classify(err: GatewayError) -> tuple[int, str, str]:
    if err.kind not in UPSTREAM_KINDS:
        return _BY_KIND.get(err.kind, (500, "api_error", "internal_error"))
    status = upstream_client_status(err)
    code: str
    if status == 502:
        code = err.kind if err.kind in _OWN_CODE else "upstream_error"
        return 502, "upstream_error", code
    err_type, code = _UPSTREAM_BY_STATUS.get(status, ("api_error", "upstream_error"))
    return status, err_type, code


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    status, err_type, code = _classify(err)
    message = str(err.message) if err.message else err_type.replace("_", " ")
    body = msgspec.json.encode(
        {"error": {"message": message, "type": err_type, "param": err.param, "code": code}}
    )
    return status, body, retry_after_headers(err)
