"""W3C Trace Context: the `traceparent` a client sends, and the one sent to the upstream. Pure.

    traceparent: 00-<trace id, 32 hex>-<parent span id, 16 hex>-<flags, 2 hex>

A request's ids are fixed when it arrives: its trace (the client's, or a new one), its own span
and the span of its upstream call, whose id goes to the backend (vLLM continues the trace from
it). The spans themselves are built when the request ends (spans.py), from those ids and the
record's timings, so nothing on the request's path waits on tracing.
"""

from __future__ import annotations

import random
import re

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_rand = random.SystemRandom()


def parse(header: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) from a `traceparent`, or None when absent or invalid
    (version ff, all-zero ids, wrong lengths: the spec says start a new trace then)."""
    if not header:
        return None
    m = _TRACEPARENT.match(header.strip().lower())
    if m is None:
        return None
    version, trace, span, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def new_span_id() -> int:
    return _rand.getrandbits(64) or 1


def new_trace_id() -> int:
    return _rand.getrandbits(128) or 1


def format(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


class RequestTrace:
    """One request's place in a trace (on `Tracked.trace`)."""

    __slots__ = ("trace_id", "parent_id", "span_id", "upstream_id", "sampled", "tracestate", "prompt")

    def __init__(self, trace_id: int, parent_id: int | None, sampled: bool, tracestate: str | None = None) -> None:
        self.trace_id = trace_id
        self.parent_id = parent_id  # the client's span, when it sent a traceparent
        self.span_id = new_span_id()
        self.upstream_id = new_span_id()
        self.sampled = sampled
        self.tracestate = tracestate
        self.prompt: str | None = None  # only with tracing.capture_content

    def upstream_headers(self) -> dict[str, str]:
        h = {"traceparent": format(self.trace_id, self.upstream_id, self.sampled)}
        if self.tracestate:
            h["tracestate"] = self.tracestate
        return h
