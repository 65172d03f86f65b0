"""A finished request's spans, planned from its record: which spans, their parents, times and
attributes (the OpenTelemetry GenAI semantic conventions). Pure: otel.py turns the plan into
SDK spans.

    chat <model>            SERVER  arrival -> end; gen_ai.* usage, the key, backend, outcome
    ├── queue               waiting for a backend slot
    ├── load wait           waiting for the model to be loaded (managed backends)
    └── upstream            CLIENT  the call to the backend (its id is the backend's parent)
        └── first token     the upstream call's start -> the first token written

The record keeps durations, not instants, so the instants are rebuilt backwards from the end:
the slot was taken `slot_seconds` before it was given back (at the request's end), the queue
wait ended there, the load wait and then the upstream call followed. Each child is clamped
inside its parent.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Protocol

from .traceparent import RequestTrace

SERVER, CLIENT, INTERNAL = "server", "client", "internal"
# the operation by the path's last segment (OpenTelemetry's gen_ai names where it has one)
_OPERATION = {"embeddings": "embeddings", "rerank": "rerank", "score": "score",
              "transcriptions": "transcription", "translations": "translation", "speech": "speech",
              "generations": "image_generation", "edits": "image_edit"}


class PlannedSpan(NamedTuple):
    name: str
    span_id: int
    parent_id: int | None
    kind: str
    start: float  # Unix seconds
    end: float
    attributes: dict


class SpanRecord(Protocol):
    """What a plan reads of a finished request's record (request.tracker.Tracked). Declared here,
    read-only: tracing sits beside the request layer and does not import it."""

    @property
    def trace(self) -> RequestTrace | None: ...
    @property
    def id(self) -> str: ...
    @property
    def dialect(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def upstream_model(self) -> str | None: ...
    @property
    def backend(self) -> str | None: ...
    @property
    def key_name(self) -> str | None: ...
    @property
    def stream(self) -> bool: ...
    @property
    def status(self) -> int: ...
    @property
    def outcome(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def started_wall(self) -> float: ...
    @property
    def tokens_in(self) -> int | None: ...
    @property
    def tokens_out(self) -> int: ...
    @property
    def tokens_cached(self) -> int | None: ...
    @property
    def slot_seconds(self) -> float: ...
    @property
    def queue_wait(self) -> float | None: ...
    @property
    def load_wait(self) -> float: ...
    @property
    def ttft(self) -> float | None: ...
    @property
    def client(self) -> str: ...
    @property
    def endpoint(self) -> str: ...


def plan(t: SpanRecord, now_mono: float | None = None, path: str = "") -> list[PlannedSpan]:
    trace = t.trace
    assert trace is not None  # Tracer.export plans only a sampled request's spans
    end_mono = time.monotonic() if now_mono is None else now_mono
    t0 = t.started_wall
    start, end = t0, t0 + max(0.0, end_mono - t.started)

    def at(mono_offset: float) -> float:
        return min(end, max(start, t0 + mono_offset))

    operation = _OPERATION.get(path.rsplit("/", 1)[-1], "chat")
    attrs: dict = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": t.model or "",
        "homelab.request_id": t.id,
        "homelab.dialect": t.dialect,
        "homelab.outcome": t.outcome,
        "homelab.stream": bool(t.stream),
        "http.response.status_code": int(t.status or 0),
    }
    if t.upstream_model:
        attrs["gen_ai.response.model"] = t.upstream_model
    if t.key_name:
        attrs["homelab.key"] = t.key_name
    if t.client:  # the address as believed (policy/forwarded.py), not a proxy's
        attrs["client.address"] = t.client
    if t.endpoint:  # the route as written: OTel's http.route
        attrs["http.route"] = t.endpoint
    if t.backend:
        attrs["homelab.backend"] = t.backend
    if t.tokens_in is not None:
        attrs["gen_ai.usage.input_tokens"] = int(t.tokens_in)
        attrs["gen_ai.usage.output_tokens"] = int(t.tokens_out or 0)
        if t.tokens_cached is not None:
            attrs["gen_ai.usage.cache_read.input_tokens"] = int(t.tokens_cached)
    else:  # no usage report (a stream cut short): the gateway's own count, said to be one
        attrs["gen_ai.usage.output_tokens"] = int(t.tokens_out or 0)
        attrs["homelab.usage.estimated"] = True
    if t.outcome != "ok":
        attrs["error.type"] = t.outcome
    if trace.prompt is not None:
        attrs["gen_ai.input.messages"] = trace.prompt
    name = f"{operation} {t.model}" if t.model else operation
    spans = [PlannedSpan(name, trace.span_id, trace.parent_id, SERVER, start, end, attrs)]
    slot = t.slot_seconds or 0.0
    if t.queue_wait is None and not slot:
        return spans  # never reached admission (refused, or failed before): the one span
    admitted = max(start, end - slot)
    queue = t.queue_wait or 0.0
    spans.append(PlannedSpan("queue", _child(trace.span_id, 1), trace.span_id, INTERNAL,
                             max(start, admitted - queue), max(start, admitted), {"homelab.backend": t.backend or ""}))
    load = t.load_wait
    up_start = admitted
    if load:
        spans.append(PlannedSpan("load wait", _child(trace.span_id, 2), trace.span_id, INTERNAL,
                                 admitted, min(end, admitted + load), {}))
        up_start = min(end, admitted + load)
    if slot:
        up_attrs = {"gen_ai.operation.name": operation, "gen_ai.request.model": t.upstream_model or t.model,
                    "server.address": t.backend or ""}
        spans.append(PlannedSpan("upstream", trace.upstream_id, trace.span_id, CLIENT, up_start, end, up_attrs))
        if t.ttft is not None:
            spans.append(PlannedSpan("first token", _child(trace.span_id, 3), trace.upstream_id, INTERNAL,
                                     up_start, max(up_start, at(t.ttft)), {}))
    return spans


def _child(span_id: int, n: int) -> int:
    """A child's id, derived from its parent's (random) id: unique within the trace."""
    return ((span_id * 0x9E3779B97F4A7C15 + n) & 0xFFFFFFFFFFFFFFFF) or n
