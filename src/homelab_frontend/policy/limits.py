"""Request limits beyond the body size: JSON nesting depth, number of messages and tools, total
header bytes. Each refusal names the field and the config key that sets the limit.

Why a depth limit at all: msgspec (like the stdlib json module) decodes recursively and raises
`RecursionError` at about a thousand levels, depending on how deep the caller's stack already is.
It never crashes the process, but a body a little under that depth decodes fine and then fails
when the gateway re-encodes a tool's schema or input for the upstream, a few frames deeper. An
explicit limit far below the interpreter's makes the answer a clear 400 everywhere.

Cost: for a body with at most `max_json_depth` brackets and fewer commas than the count limits
(most short requests) two C-speed counts decide, in about a microsecond. Otherwise the body is
decoded once more and walked without recursion: 3 to 4 ms for a 740 KB Claude Code-like
conversation (300 messages, 25 tools), about 1.5x what the surface's own parser takes for it, and
nothing next to a generation. Keeping this check separate keeps the parsers untouched and the
limits in one place.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from aiohttp import web

from ..config import Limits
from ..errors import GatewayError


def check_headers(request: web.Request, limits: Limits) -> None:
    """Total size of the request's header lines (names and values) against max_header_bytes.
    aiohttp's parser refuses any single header over a hard cap before we get here
    (`parser_field_cap`); this is the limit a client meets in its own dialect."""
    total = sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
    if total > limits.max_header_bytes:
        raise GatewayError(
            "request_too_large",
            f"the request headers are {total} bytes; the limit is {limits.max_header_bytes}"
            " (limits.max_header_bytes)",
        )


def parser_field_cap(limits: Limits) -> int:
    """aiohttp's own per-header cap (its refusal is a bare text 400): well above our limit, so
    that a header between the two still gets the clear error from `check_headers`."""
    return max(4 * limits.max_header_bytes, 8190)


def check_json(body: bytes, limits: Limits, *, counted: tuple[str, ...] = ("messages", "tools")) -> None:
    """Nesting depth and list lengths of a JSON body. A body that is not JSON passes: the
    surface's parser then says what is wrong with it in its own words."""
    depth = limits.max_json_depth
    # Upper bounds read at C speed: the depth is at most the number of brackets, a list's length
    # at most its commas plus one (brackets and commas inside strings only make them larger).
    shallow = body.count(b"[") + body.count(b"{") <= depth
    short = not counted or body.count(b",") < min(_limit_of(limits, f) for f in counted)
    if shallow and short:
        return
    try:
        doc = msgspec.json.decode(body)
    except RecursionError:
        raise GatewayError(
            "invalid_request",
            f"the body nests JSON too deeply to decode; the limit is {depth} levels (limits.max_json_depth)",
        ) from None
    except msgspec.DecodeError:
        return
    if not shallow:
        where = _too_deep(doc, depth)
        if where is not None:
            raise GatewayError(
                "invalid_request",
                f"{where or 'the body'}: JSON nested more than {depth} levels deep (limits.max_json_depth)",
                param=where or None,
            )
    if isinstance(doc, dict):
        for field in counted:
            value = doc.get(field)
            limit = _limit_of(limits, field)
            if isinstance(value, list) and len(value) > limit:
                name, noun = ("max_messages", {"input": "items"}.get(field, field)) if field in ("input", "contents") \
                    else (f"max_{field}", field)
                raise GatewayError(
                    "invalid_request",
                    f"{field}: {len(value)} {noun} is more than the limit of {limit} (limits.{name})",
                    param=field,
                )


def _limit_of(limits: Limits, field: str) -> int:
    # a Responses request's `input` items and a Gemini request's `contents` are its messages
    return limits.max_messages if field in ("messages", "input", "contents") else limits.max_tools


def _too_deep(doc: Any, limit: int) -> str | None:
    """The path of the first container nested deeper than `limit` (the body itself is level 1),
    e.g. "tools[0].input_schema.properties"; None when none is. The walk keeps no paths (most
    bodies pass); only a refused one is walked again to name the field."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        obj, level = stack.pop()
        if level > limit:
            return _path_to(doc, limit)
        below = level + 1
        for v in obj.values() if type(obj) is dict else obj:
            if type(v) is dict or type(v) is list:
                stack.append((v, below))
    return None


def _path_to(doc: Any, limit: int) -> str:
    stack: list[tuple[Any, int, tuple]] = [(doc, 1, ())]
    while stack:
        obj, level, path = stack.pop()
        if level > limit:
            return _dotted(path)
        for k, v in obj.items() if type(obj) is dict else enumerate(obj):
            if type(v) is dict or type(v) is list:
                stack.append((v, level + 1, path + (k,)))
    return ""


def _dotted(path: tuple) -> str:
    out = ""
    for part in path[:12]:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out + ("..." if len(path) > 12 else "")


class _QuietParserErrors(logging.Filter):
    """aiohttp logs a request it could not parse (a header over its cap, a broken request line)
    with a traceback that quotes the offending bytes, which may be a key. Keep one plain line,
    at INFO: a 400 is the client's fault, and anyone who can reach the port could otherwise
    fill the operator's error log."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__module__.startswith("aiohttp.http_exceptions"):
            try:
                what = record.getMessage()
            except (TypeError, ValueError):
                what = str(record.msg)
            record.msg = "%s (%s; request refused with 400)"
            record.args = (what, type(exc).__name__)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_parser_errors() -> None:
    logging.getLogger("aiohttp.server").addFilter(_QuietParserErrors())
