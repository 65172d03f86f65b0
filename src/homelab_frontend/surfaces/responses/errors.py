"""`GatewayError` -> an error response in the Responses dialect: the OpenAI shape
(surfaces/openai_errors.py) with the codes Responses clients act on.

* A prompt that does not fit the model's context (the gateway's own check in chat.open_chat, or the
  upstream's refusal) has code `context_length_exceeded` and `param` `input`: Codex then compacts
  its history instead of retrying the same request.
* A refusal for load (429) says "Please try again in N s." when the error carries a Retry-After,
  the sentence Codex parses to time its retry (besides the `retry-after` header).
"""

from __future__ import annotations

import msgspec

from ...request.context_clamp import context_refusal
from ...errors import GatewayError
from ..openai.errors import render_error as render_openai

__all__ = ["render_error", "failure_code", "is_context_error"]


def is_context_error(err: GatewayError) -> bool:
    """The gateway's own refusal (chat.open_chat), vLLM's 400 (both wordings) or llama.cpp's
    `exceed_context_size_error` ("the request exceeds the available context size")."""
    msg = str(err.message or "")
    if err.kind not in ("invalid_request", "upstream_error"):
        return False
    return ("no room left to answer" in msg or context_refusal(msg) is not None
            or "maximum context length" in msg
            or "exceed" in msg and ("context length" in msg or "context size" in msg))


def failure_code(err: GatewayError) -> str:
    """The `error.code` of a `response.failed` event for an error raised inside a stream."""
    if is_context_error(err):
        return "context_length_exceeded"
    if err.kind in ("overloaded", "rate_limit"):
        return "rate_limit_exceeded"
    return "server_error"


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    status, body, headers = render_openai(err)
    doc = msgspec.json.decode(body)
    e = doc["error"]
    if is_context_error(err):
        e["code"] = "context_length_exceeded"
        e["param"] = "input"
    elif status == 429 and "retry-after" in headers and "try again in" not in e["message"]:
        e["message"] = f"{e['message'].rstrip('.')}. Please try again in {headers['retry-after']}s."
    return status, msgspec.json.encode(doc), headers
