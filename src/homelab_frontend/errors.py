"""Dialect-neutral failures. Every surface renders a `GatewayError` in its own error shape."""

from __future__ import annotations

import re
from typing import Literal

ErrorKind = Literal[
    "invalid_request",  # 400
    "authentication",  # 401
    "permission",  # 403
    "not_found",  # 404
    "request_too_large",  # 413
    "rate_limit",  # 429: this client is over its own limit
    "overloaded",  # no slot and no room (or time) to wait: Anthropic 529, OpenAI 429
    "upstream_unreachable",  # 502: could not reach the backend
    "upstream_error",  # the backend answered with an error status (passed on)
    "upstream_too_large",  # 502: the backend sent more than its read limits allow
    "upstream_malformed",  # 502: the backend's answer is not a chat completion (or chunk)
    "backend_down",  # 503: its health probe marked the backend down
    "timeout",  # 504: the backend took too long (connect, first token, idle, total)
    "api_error",  # 500: our own fault; never with a stack trace
]

DEFAULT_STATUS: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "request_too_large": 413,
    "rate_limit": 429,
    "overloaded": 529,
    "upstream_unreachable": 502,
    "upstream_error": 502,
    "upstream_too_large": 502,
    "upstream_malformed": 502,
    "backend_down": 503,
    "timeout": 504,
    "api_error": 500,
}


class GatewayError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status if status is not None else DEFAULT_STATUS[kind]
        self.param = param  # the offending field path, e.g. "messages[2].content"
        self.retry_after = retry_after  # seconds, for overloaded / rate_limit


_TRACE = re.compile(r"Traceback \(most recent call last\)|\n\s+File \"")
_ADDR = re.compile(
    r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+"  # any URL: http://10.0.0.5:8000/v1, redis://...
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # IPv4, with or without a port
    r"|\[[0-9a-f:.]*:[0-9a-f:.]*\](?::\d+)?"  # [IPv6]:port
    r"|\b(?:localhost|[a-z0-9-]+(?:\.[a-z0-9-]+)+):\d{2,5}\b",  # host.name:port
    re.IGNORECASE,
)


def clean_message(text: str, limit: int = 1000) -> str:
    """An upstream's error text, fit for a client: no traceback, no internal address."""
    m = _TRACE.search(text)
    if m:
        text = text[: m.start()].rstrip() or "internal error in the backend"
    text = _ADDR.sub("<backend>", text)
    return text[:limit]
