"""Dialect-neutral failures. Every surface renders a `GatewayError` in its own error shape."""

from __future__ import annotations

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
