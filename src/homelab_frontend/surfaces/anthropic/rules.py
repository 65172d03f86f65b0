"""Anthropic wire rules both encoders follow (stream.py for SSE, assemble.py for one message):
the stop-reason table, what a valid tool-use id is, and the one generator of ids.

One module, so the streaming and the whole-message answers cannot drift apart: a client that
switches `stream` on or off sees the same stop reasons and the same id shapes."""

from __future__ import annotations

import re
import secrets
import string

__all__ = ["STOP_REASONS", "new_message_id", "new_tool_use_id", "tool_use_id"]

# canonical Finish.reason -> Anthropic stop_reason; anything else is end_turn
STOP_REASONS: dict[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}

_BASE62 = string.ascii_letters + string.digits
# byte -> base62 character. 256 is not a multiple of 62, so eight characters are a little more
# likely (5/256 against 4/256): 24 of them still carry over 140 random bits, and one getrandom
# call replaces the 24 that secrets.choice made (one per character, on every request).
_TO_BASE62 = bytes(ord(_BASE62[i % 62]) for i in range(256))


def _random_suffix(n: int = 24) -> str:
    return secrets.token_bytes(n).translate(_TO_BASE62).decode()


def new_message_id() -> str:
    """`msg_` + 24 random base62 characters."""
    return "msg_" + _random_suffix()


def new_tool_use_id() -> str:
    """`toolu_` + 24 random base62 characters."""
    return "toolu_" + _random_suffix()


# Anthropic's pattern for tool_use ids (the API refuses a later turn that echoes another shape)
_VALID_TOOL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}").fullmatch


def tool_use_id(upstream_id: str | None, used: set[str], new=new_tool_use_id) -> str:
    """The id a tool_use block gets: the upstream's, when it is valid and not yet used in this
    message, else a fresh one. Records it in `used`."""
    tool_id = upstream_id if upstream_id and _VALID_TOOL_ID(upstream_id) and upstream_id not in used else new()
    used.add(tool_id)
    return tool_id
