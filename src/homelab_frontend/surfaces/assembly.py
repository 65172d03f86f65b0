"""What every dialect's encoders do alike when they turn canonical events into an answer, kept in
one place so the dialects cannot drift apart:

Tool-call arguments (`tool_arguments`)
    The concatenated argument fragments parsed as JSON; empty or `null` -> `{}`; anything that is
    not a JSON object (cut off by the token limit, malformed by a small model) ->
    `{"_raw_arguments": "<the text>"}`, so the client reports a bad call back to the model instead
    of the turn failing (a 502 would throw the turn away, and a 500 is never right).
An upstream failure in a whole answer (`upstream_failure`)
    `timeout_error` -> `GatewayError` kind `timeout` (504), `overloaded_error` -> `upstream_error`
    with status 503, anything else -> `upstream_error` (502); each dialect renders it in its own
    error shape.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .. import canonical as c
from ..errors import GatewayError

__all__ = ["tool_arguments", "upstream_failure"]


def tool_arguments(raw: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {"_raw_arguments": raw}
    if value is None:
        return {}
    return value if isinstance(value, dict) else {"_raw_arguments": raw}


def upstream_failure(err: c.UpstreamError) -> GatewayError:
    message = err.message or "the upstream failed while answering"
    if err.kind == "timeout_error":
        return GatewayError("timeout", message)
    if err.kind == "overloaded_error":
        return GatewayError("upstream_error", message, status=503)
    return GatewayError("upstream_error", message)
