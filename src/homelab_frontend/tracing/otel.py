"""Traces over OTLP/HTTP with the OpenTelemetry SDK (the `[otel]` extra), imported only when
`tracing.otlp_endpoint` is configured: with tracing off the request path sees one `is None`.

Spans are made when a request ends (spans.py plans them from its record) and handed to the
SDK's BatchSpanProcessor, which exports from its own thread: nothing on the event loop waits on
the collector. The SDK's environment variables apply as usual (OTEL_BSP_SCHEDULE_DELAY,
OTEL_BSP_MAX_QUEUE_SIZE, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT,
OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME); OTEL_SDK_DISABLED=true
turns tracing off.

Sampling: a client's `traceparent` decides (sampled: kept and continued; not sampled: passed on
to the backend as it is, no spans); a request without one starts a trace kept with probability
`tracing.sample` (by trace id, as the SDK's TraceIdRatioBased does).
"""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

import msgspec

from .. import config as cfgmod
from . import spans as plan_mod
from . import traceparent

log = logging.getLogger("homelab_frontend")
_PROMPT_LIMIT = 16 * 1024  # bytes of prompt text in a span, with capture_content


def endpoint_url(url: str) -> str:
    """A bare collector address gets OTLP/HTTP's traces path."""
    return url.rstrip("/") + "/v1/traces" if urlsplit(url).path in ("", "/") else url


def start(cfg: cfgmod.Tracing) -> "Tracer | None":
    if cfg.otlp_endpoint is None:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        log.info("tracing: off (OTEL_SDK_DISABLED=true)")
        return None
    try:
        return Tracer(cfg)
    except ImportError:
        raise cfgmod.ConfigError([
            "tracing: needs OpenTelemetry; install it with pip install 'homelab-frontend[otel]'"
        ]) from None


class Tracer:
    def __init__(self, cfg: cfgmod.Tracing) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        from .. import __name__ as pkg

        attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: cfg.service_name}
        self.resource = Resource.create(attrs)  # adds OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
        self.endpoint = endpoint_url(cfg.otlp_endpoint or "")
        self.processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint))
        self.scope = InstrumentationScope(pkg)
        self.bound = round(max(0.0, min(1.0, cfg.sample)) * (1 << 64))
        self.capture = cfg.capture_content
        self._ReadableSpan, self._SpanContext, self._TraceFlags = ReadableSpan, SpanContext, TraceFlags
        self._kinds = {plan_mod.SERVER: SpanKind.SERVER, plan_mod.CLIENT: SpanKind.CLIENT,
                       plan_mod.INTERNAL: SpanKind.INTERNAL}
        self._ok, self._error = Status(StatusCode.UNSET), StatusCode.ERROR
        self._Status = Status
        log.info("tracing: spans to %s over OTLP/HTTP (sample %g)", self.endpoint, cfg.sample)

    def begin(self, headers) -> traceparent.RequestTrace | None:
        """The request's trace ids, or None when it is not traced at all."""
        parent = traceparent.parse(headers.get("traceparent"))
        if parent is not None:
            trace_id, parent_id, sampled = parent
            return traceparent.RequestTrace(trace_id, parent_id, sampled, headers.get("tracestate"))
        trace_id = traceparent.new_trace_id()
        if (trace_id & 0xFFFFFFFFFFFFFFFF) >= self.bound:
            return None
        return traceparent.RequestTrace(trace_id, None, True)

    def remember_prompt(self, t, body: bytes) -> None:
        """With capture_content: the request's messages (as the client sent them, cut at 16 kB)."""
        if not self.capture or t.trace is None:
            return
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return
        if isinstance(doc, dict):
            part = next((doc[k] for k in ("messages", "input", "contents", "prompt") if k in doc), None)
            if part is not None:
                t.trace.prompt = msgspec.json.encode(part)[:_PROMPT_LIMIT].decode("utf-8", "ignore")

    def export(self, t: plan_mod.SpanRecord, path: str = "") -> None:
        trace = t.trace
        if trace is None or not trace.sampled or not t.model:
            return  # not a model call (a listing a client polls, a refused key): no trace worth keeping
        flags = self._TraceFlags(self._TraceFlags.SAMPLED)
        planned = plan_mod.plan(t, path=path)
        ctx = {p.span_id: self._SpanContext(trace.trace_id, p.span_id, is_remote=False, trace_flags=flags)
               for p in planned}
        for p in planned:
            parent = ctx.get(p.parent_id) if p.parent_id is not None else None
            if parent is None and p.parent_id is not None:  # the client's span
                parent = self._SpanContext(trace.trace_id, p.parent_id, is_remote=True, trace_flags=flags)
            failed = p.kind == plan_mod.SERVER and t.outcome != "ok"
            span = self._ReadableSpan(
                name=p.name, context=ctx[p.span_id], parent=parent, resource=self.resource,
                attributes=p.attributes, kind=self._kinds[p.kind], instrumentation_scope=self.scope,
                status=self._Status(self._error, t.outcome) if failed else self._ok,
                start_time=int(p.start * 1e9), end_time=int(p.end * 1e9),
            )
            self.processor.on_end(span)

    def close(self) -> None:
        self.processor.shutdown()  # exports what is queued (bounded by the exporter's timeout)
