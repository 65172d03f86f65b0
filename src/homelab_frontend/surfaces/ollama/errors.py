"""`GatewayError` -> an Ollama error response: (status, body, extra headers). Pure.

Ollama's errors are `{"error": "<text>"}` under `application/json` (the JavaScript library reads
the text only then) with plain HTTP statuses; both official libraries raise `ResponseError` with
that text and the status.

    kind                  status  text
    invalid_request       400     the message, which starts with the offending field
    authentication        401     the message
    permission            403     the message
    not_found             404     `model "x" not found` for an unknown model (Ollama's words, so
                                  clients that look for them, e.g. to offer a pull, still do)
    request_too_large     413
    rate_limit            429     with Retry-After
    overloaded            503     with Retry-After (Ollama's own answer when its queue is full:
                                  "server busy, please try again")
    api_error             500
    backend_down          503     with Retry-After
    upstream kinds        the status `error_status.upstream_client_status` gives (400, 404, 413,
                          429, 502, 504, 5xx; 529 -> 503)
"""

from __future__ import annotations

import msgspec

from ...errors import DEFAULT_STATUS, GatewayError
from ..error_status import UPSTREAM_KINDS, retry_after_headers, upstream_client_status

__all__ = ["model_not_found", "render_error"]

# the gateway's own statuses, but Ollama's "server busy" is a 503 (it has no 529)
_BY_KIND = {**DEFAULT_STATUS, "overloaded": 503}


def model_not_found(model: str, available: list[str]) -> GatewayError:
    names = ", ".join(available) or "(none)"
    return GatewayError("not_found", f"model {msgspec.json.encode(model).decode()} not found; "
                                     f"available models: {names}", param="model")


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    if err.kind in UPSTREAM_KINDS:
        status = upstream_client_status(err)
    else:
        status = _BY_KIND.get(err.kind, 500)
    message = str(err.message) if err.message else "error"
    return status, msgspec.json.encode({"error": message}), retry_after_headers(err)
