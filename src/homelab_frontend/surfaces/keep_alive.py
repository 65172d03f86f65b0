"""A client's `keep_alive` in any dialect's body, applied to the managed backends of its route.

Ollama's own API has the field (surfaces/ollama/ parses it with the rest of its body); clients of
Ollama's `/v1` send it in the OpenAI body too (ollama#11458, #9355: Ollama ignores it there, the
gateway does not), and an SDK's `extra_body` puts it in an Anthropic, Responses or Gemini body
alike. So every dialect's body is looked at here, once: only a body that contains the bytes
`"keep_alive"` is decoded again, for its one top-level field (msgspec skips the rest), so the
common request pays a substring search. What it means: lifecycle/keep_alive.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import GatewayError
from ..lifecycle.keep_alive import Forever, seconds
from ..policy.routing import Route
from .context import Gateway


class _Field(msgspec.Struct):
    keep_alive: Any = None


_decode = msgspec.json.Decoder(_Field).decode
_NEEDLE = b'"keep_alive"'


def parse(value: Any) -> float | Forever | None:
    """A keep_alive value in seconds (FOREVER when negative); None when absent. A 400 naming the
    field when it is no duration."""
    if value is None:
        return None
    try:
        return seconds(value)
    except ValueError as err:
        raise GatewayError("invalid_request", f"keep_alive: {err}", param="keep_alive") from None


def from_body(body: bytes) -> float | Forever | None:
    """The top-level `keep_alive` of a JSON object body (already parsed once by the dialect, so
    known to be JSON), in seconds; None when absent."""
    if _NEEDLE not in body:
        return None
    try:
        field = _decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):  # not an object: the dialect said so already
        return None
    return parse(field.keep_alive)


def apply(gw: Gateway, route: Route, asked: float | Forever | None, *, prompt: bool = True) -> None:
    """Tell the fleet what the client asked of the managed backends that serve `route` (others
    have no lifetime to set)."""
    if asked is None:
        return
    fleet = gw.fleet
    for b in route.backends:
        if fleet.managed(b.name):
            fleet.keep_alive(b.name, asked, prompt=prompt)
