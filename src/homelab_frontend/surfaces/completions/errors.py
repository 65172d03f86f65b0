"""`GatewayError` -> llama.cpp's error answer, for the gateway's `/infill` (pure). The status is the
OpenAI surface's for the same kind (surfaces/openai/errors.py: the one table of statuses), the body
llama.cpp's own `{"error": {"code", "message", "type"}}` that llama.vscode reads."""

from __future__ import annotations

import msgspec

from ...errors import GatewayError
from ..openai.errors import render_error as openai_error
from .encode import infill_error

__all__ = ["render_error"]


def render_error(err: GatewayError) -> tuple[int, bytes, dict[str, str]]:
    status, _, headers = openai_error(err)
    return status, msgspec.json.encode(infill_error(status, err.message)), headers
