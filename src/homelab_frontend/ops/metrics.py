"""Prometheus metrics at GET /metrics, and the dashboard's numbers at GET /admin/stats.

Two kinds of numbers, kept apart on purpose:
- What *happened* (requests by outcome, latencies, tokens, upstream errors) is counted once per
  finished request in `observe()`, which runs on every request: it does one dict lookup for the
  cached label children and a handful of increments, nothing else.
- What *is* (slots in use, queue depth, backend up, in-flight by phase, the leaked-slot mismatch)
  is read from the live Gateway state when somebody scrapes, by `_LiveCollector`. The hot path
  never updates a gauge, so a gauge can never drift from the state it describes.

Every Gateway gets its own CollectorRegistry (tests run several gateways in one process; the
global registry would mix them). Label values are bounded by the config: `model` is the configured
model a client name resolved to (never the raw client string, which is unbounded input), and ""
when it named none.

The same module keeps what the dashboard shows and Prometheus does not: a ring of recent finished
requests, and a once-a-second sample of the token and request totals for the throughput chart.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import deque

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .. import config as cfgmod
from ..policy.routing import resolve_alias
from ..request.tracker import Tracked
from .context import OPS_GATEWAY, OpsGateway
from .context import gateway as _gw

RECENT = 100  # finished requests kept for the dashboard
HISTORY = 180  # one-second throughput samples kept (3 minutes)
_LABEL_CACHE = 20_000  # label-child sets cached; past this (absurd) count they are built per call

QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

# outcome -> the `kind` label of hlf_upstream_errors_total: failures that are the backend's doing
_UPSTREAM_KINDS = {
    "error_upstream_error": "status",  # it answered with an error status
    "error_upstream_unreachable": "unreachable",  # connect failed or it hung up before headers
    "error_upstream_midstream": "midstream",  # the stream broke, or carried an error frame
    "error_timeout": "timeout",  # first token, idle or total deadline passed
    "error_upstream_too_large": "too_large",  # a line or body over the backend's read limits
    "error_upstream_malformed": "malformed",  # an answer or chunk that is not a chat completion
    "error_backend_down": "down",  # refused at once: its health probe marked it down
}


# -- recorded series ------------------------------------------------------------------------------
# prometheus_client's own Counter and Histogram take a lock per update and scan the buckets; the
# gateway updates and scrapes on one event-loop thread, so plain attributes and a bisect do (an
# observe() went from ~16 us to ~4 us; see the README). They are exposed through the same client
# library's metric families, so the text format is the library's.


class _CounterSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _HistSeries:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # first bound >= value: `le` semantics
        self.sum += value


class _Family:
    def __init__(self, name: str, doc: str, labelnames: list[str], buckets: tuple | None = None) -> None:
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self.bounds = tuple(float(b) for b in buckets) if buckets else None
        self.series: dict[tuple[str, ...], _CounterSeries | _HistSeries] = {}

    def labels(self, *values: str):
        s = self.series.get(values)
        if s is None:
            s = self.series[values] = _HistSeries(self.bounds) if self.bounds else _CounterSeries()
        return s

    def family(self):
        if self.bounds is None:
            fam = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
            for values, c in sorted(self.series.items()):
                fam.add_metric(list(values), c.value)
            return fam
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, h in sorted(self.series.items()):
            cum, buckets = 0, []
            for bound, n in zip(self.bounds, h.counts):
                cum += n
                buckets.append((floatToGoString(bound), cum))
            buckets.append(("+Inf", cum + h.counts[-1]))
            fam.add_metric(list(values), buckets, h.sum)
        return fam


class _Recorded:
    """Exposes the recorded families to the registry."""

    def __init__(self, families: list[_Family]) -> None:
        self.families = families

    def collect(self):
        for f in self.families:
            yield f.family()


class _Noop:
    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_NOOP = _Noop()


class _Children:
    """The label series one finished request touches, looked up once per label set."""

    __slots__ = ("requests", "queue_wait", "ttft", "tpot", "duration", "tokens_in", "tokens_out", "upstream_error",
                 "tokens_cached")

    def __init__(self, m: "Metrics", dialect: str, model: str, backend: str, outcome: str) -> None:
        self.requests = m.requests.labels(dialect, model, backend, outcome)
        self.duration = m.duration.labels(dialect, backend, model)
        if not backend:  # refused before routing: no queue, no tokens; no empty-label series
            self.queue_wait = self.ttft = self.tpot = self.tokens_in = self.tokens_out = _NOOP
            self.tokens_cached = _NOOP
            self.upstream_error = None
            return
        self.queue_wait = m.queue_wait.labels(backend)
        self.ttft = m.ttft.labels(backend, model)
        self.tpot = m.tpot.labels(backend, model)
        self.tokens_in = m.tokens_in.labels(backend, model)
        self.tokens_out = m.tokens_out.labels(backend, model)
        self.tokens_cached = m.tokens_cached.labels(backend, model)
        kind = _UPSTREAM_KINDS.get(outcome)
        self.upstream_error = m.upstream_errors.labels(backend, kind) if kind else None


class Metrics:
    def __init__(self, gw: OpsGateway) -> None:
        self.gw = gw
        self.requests = _Family(
            "hlf_requests", "Finished requests by dialect, configured model, backend and outcome.",
            ["dialect", "model", "backend", "outcome"])
        self.queue_wait = _Family(
            "hlf_queue_wait_seconds", "Time a request waited for a backend slot.", ["backend"], QUEUE_WAIT_BUCKETS)
        self.ttft = _Family(
            "hlf_time_to_first_token_seconds", "Arrival to the first generated token written (streams).",
            ["backend", "model"], TTFT_BUCKETS)
        self.tpot = _Family(
            "hlf_time_per_output_token_seconds", "Mean time between output tokens after the first (streams).",
            ["backend", "model"], TPOT_BUCKETS)
        self.duration = _Family(
            "hlf_request_duration_seconds", "Arrival to the last byte (or the end of a cancellation).",
            ["dialect", "backend", "model"], DURATION_BUCKETS)
        self.tokens_in = _Family(
            "hlf_input_tokens", "Prompt tokens, as the backend reported them.", ["backend", "model"])
        self.tokens_out = _Family(
            "hlf_output_tokens", "Generated tokens (the backend's count where it gave one).", ["backend", "model"])
        self.tokens_cached = _Family(
            "hlf_cached_input_tokens", "Prompt tokens the backend served from its prefix cache, as it reported "
            "them (backends that report none count none).", ["backend", "model"])
        self.affinity = _Family(
            "hlf_affinity_requests", "Requests routed by session affinity: hit (their session's backend) or "
            "spill (it was too busy: the least-loaded backend instead).", ["model", "result"])
        self.upstream_errors = _Family(
            "hlf_upstream_errors", "Requests that failed on the backend's side, by kind.", ["backend", "kind"])
        self.failovers = _Family(
            "hlf_failovers", "Requests moved to another backend after this one failed them before answering, "
            "by cause (request/failover.py).", ["backend", "cause"])
        self.reloads = _Family(
            "hlf_config_reloads", "Config reloads (SIGHUP or POST /admin/reload) by result.", ["result"])
        self.clamps = _Family(
            "hlf_context_clamps",
            "Requests whose max_tokens had to be fitted to the context, by how: tokenizer (counted by the "
            "backend), estimate (no tokenizer), retry (the backend refused the first try).",
            ["backend", "how"])
        self.registry = r = CollectorRegistry()
        r.register(_Recorded([self.requests, self.queue_wait, self.ttft, self.tpot, self.duration,
                              self.tokens_in, self.tokens_out, self.tokens_cached, self.affinity,
                              self.upstream_errors, self.failovers, self.reloads, self.clamps]))
        r.register(_LiveCollector(gw, self))
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)

        self._children: dict[tuple[str, str, str, str], _Children] = {}
        self._cfg: cfgmod.Config | None = None
        self._models: dict[str, str] = {}
        self.recent: deque[tuple] = deque(maxlen=RECENT)
        self.finished = 0
        self.failed = 0
        self.finished_tokens_out = 0
        self.started_wall = time.time()
        self.history: deque[tuple[float, int, int]] = deque(maxlen=HISTORY)
        self._sampler: asyncio.Task | None = None

    # -- the hot path ---------------------------------------------------------------------------

    def model_label(self, client_model: str) -> str:
        cfg = self.gw.cfg
        if cfg is not self._cfg:  # a reload: names may now resolve differently
            self._cfg, self._models = cfg, {}
        label = self._models.get(client_model)
        if label is None:
            label = (resolve_alias(cfg, client_model) or "") if client_model else ""
            if len(self._models) < 4096:
                self._models[client_model] = label
        return label

    def observe(self, t: Tracked) -> None:
        """Count one finished request. Runs once per request: keep it cheap."""
        now = time.monotonic()
        model = t.served_model or self.model_label(t.model)  # a fallback's tokens are its own
        backend = t.backend or ""
        key = (t.dialect, model, backend, t.outcome)
        c = self._children.get(key)
        if c is None:
            c = _Children(self, *key)
            if len(self._children) < _LABEL_CACHE:
                self._children[key] = c
        c.requests.inc()
        duration = now - t.started
        c.duration.observe(duration)
        if t.queue_wait is not None:
            c.queue_wait.observe(t.queue_wait)
        if t.ttft is not None:
            c.ttft.observe(t.ttft)
            if t.tokens_out > 1:
                c.tpot.observe(max(0.0, duration - t.ttft) / (t.tokens_out - 1))
        if t.tokens_in:
            c.tokens_in.inc(t.tokens_in)
        if t.tokens_out:
            c.tokens_out.inc(t.tokens_out)
            self.finished_tokens_out += t.tokens_out
        if t.tokens_cached:
            c.tokens_cached.inc(t.tokens_cached)
        if t.affinity is not None:
            self.affinity.labels(model, t.affinity).inc()
        if c.upstream_error is not None:
            c.upstream_error.inc()
        if t.clamp is not None and backend:
            self.clamps.labels(backend, t.clamp).inc()
        if t.failovers:
            for failed, cause in t.failovers:
                self.failovers.labels(failed, cause).inc()
        self.finished += 1
        ok = t.outcome == "ok"
        if not ok:
            self.failed += 1
        if t.model or not ok:  # model listings (clients poll them) would drown the rest
            # a tuple now, a dict only when the dashboard asks
            self.recent.append((t.id, t.dialect, t.model, t.backend, t.key_name, t.stream, t.status, t.outcome,
                                time.time(), duration, t.queue_wait, t.ttft, t.tokens_in, t.tokens_out,
                                t.endpoint, t.client))

    def reloaded(self, ok: bool) -> None:
        self.reloads.labels("ok" if ok else "rejected").inc()

    # -- throughput samples ---------------------------------------------------------------------

    def sample(self) -> None:
        """Totals so far, counting tokens of requests still streaming, so that a long stream
        shows as steady throughput rather than one spike when it ends."""
        live = sum(t.tokens_out for t in self.gw.tracker)
        self.history.append((time.time(), self.finished_tokens_out + live, self.finished))

    async def _sample_loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(1.0)

    def start(self) -> None:
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample_loop())

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None

    def throughput(self) -> list[dict]:
        out = []
        h = list(self.history)
        for (t0, tok0, req0), (t1, tok1, req1) in zip(h, h[1:]):
            dt = max(t1 - t0, 1e-3)
            # a request's running count can be replaced by a smaller final usage figure
            out.append({"t": round(t1, 3), "tokens_per_s": round(max(0, tok1 - tok0) / dt, 2),
                        "requests_per_s": round(max(0, req1 - req0) / dt, 3)})
        return out

    def stats(self) -> dict:
        gw = self.gw
        backends = {}
        for name, b in gw.backends.items():
            served = [m for m, mc in gw.cfg.models.items() if name in mc.backend_names()]
            backends[name] = {"kind": b.cfg.kind, "queue_limit": b.pool.depth, "models": served,
                              "configured": name in gw.cfg.backends}
        return {
            "now": time.time(),
            "started": self.started_wall,
            "draining": gw.draining,
            "totals": {"requests": self.finished, "failed": self.failed,
                       "tokens_out": self.finished_tokens_out + sum(t.tokens_out for t in gw.tracker)},
            "backends": backends,
            "throughput": self.throughput(),
            "recent": [_recent_dict(r) for r in reversed(self.recent)],
        }


def _hit_ratio_family(m: "Metrics") -> GaugeMetricFamily:
    ratio = GaugeMetricFamily("hlf_affinity_hit_ratio", "Share of affinity-routed requests that went to their "
                              "session's backend (since start).", labels=["model"])
    by_model: dict[str, list[float]] = {}
    for (model, result), series in m.affinity.series.items():
        assert isinstance(series, _CounterSeries)  # a family without buckets counts
        by_model.setdefault(model, [0.0, 0.0])[0 if result == "hit" else 1] += series.value
    for model, (hits, spills) in sorted(by_model.items()):
        ratio.add_metric([model], hits / (hits + spills) if hits + spills else 0.0)
    return ratio


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _recent_dict(r: tuple) -> dict:
    (rid, dialect, model, backend, key, stream, status, outcome, finished, duration, queue_wait, ttft,
     tokens_in, tokens_out, endpoint, client) = r
    return {"id": rid, "dialect": dialect, "model": model or None, "backend": backend, "key": key,
            "stream": stream, "status": status, "outcome": outcome, "finished": finished,
            "duration_ms": _ms(duration), "queue_wait_ms": _ms(queue_wait), "ttft_ms": _ms(ttft),
            "tokens_in": tokens_in, "tokens_out": tokens_out, "endpoint": endpoint, "client": client}


class _LiveCollector:
    """Gauges read from the Gateway's live state at scrape time."""

    def __init__(self, gw: OpsGateway, metrics: "Metrics") -> None:
        self.gw = gw
        self.metrics = metrics

    def collect(self):
        gw = self.gw
        yield _hit_ratio_family(self.metrics)
        slots = GaugeMetricFamily("hlf_backend_slots", "Sequence slots configured for the backend.", labels=["backend"])
        in_use = GaugeMetricFamily("hlf_backend_slots_in_use", "Slots held by requests now.", labels=["backend"])
        queued = GaugeMetricFamily("hlf_backend_queued_requests", "Requests waiting for a slot now.", labels=["backend"])
        qcap = GaugeMetricFamily("hlf_backend_queue_capacity", "Most requests allowed to wait for a slot.",
                                 labels=["backend"])
        up = GaugeMetricFamily("hlf_backend_up", "1 when the last health probe succeeded.", labels=["backend"])
        running = GaugeMetricFamily("hlf_backend_upstream_running_requests",
                                    "The backend's own count of running sequences (vLLM only).", labels=["backend"])
        mismatch = GaugeMetricFamily(
            "hlf_backend_slot_mismatch",
            "Backend's running sequences minus our slots in use: > 0 means generations nobody waits for "
            "(a leak) or another client on the backend (vLLM only).", labels=["backend"])
        for name, b in list(gw.backends.items()):
            slots.add_metric([name], b.pool.slots)
            in_use.add_metric([name], b.pool.in_use)
            queued.add_metric([name], b.pool.queued)
            qcap.add_metric([name], b.pool.depth)
            up.add_metric([name], 1 if b.up else 0)
            if b.upstream_running is not None:
                running.add_metric([name], b.upstream_running)
                mismatch.add_metric([name], b.upstream_running - b.pool.in_use)
        counts: dict[tuple[str, str], int] = {}
        for t in gw.tracker:
            k = (t.backend or "", t.phase)
            counts[k] = counts.get(k, 0) + 1
        inflight = GaugeMetricFamily("hlf_requests_in_flight", "Requests being handled now, by backend and phase.",
                                     labels=["backend", "phase"])
        for (backend, phase), n in sorted(counts.items()):
            inflight.add_metric([backend, phase], n)
        yield from (slots, in_use, queued, qcap, up, running, mismatch, inflight)
        usage = gw.usage.health() if gw.usage is not None else None
        if usage is not None and "writer_alive" in usage:
            yield GaugeMetricFamily("hlf_usage_writer_up", "1 while the usage ledger's writer thread runs.",
                                    value=1 if usage["writer_alive"] else 0)
            yield CounterMetricFamily("hlf_usage_write_errors", "Batches the usage ledger could not write.",
                                      value=usage["write_errors"])
            yield CounterMetricFamily("hlf_usage_lost_requests", "Finished requests the usage ledger lost "
                                      "(a failed write, or queued when its writer died).", value=usage["lost"])
        if gw.fleet.units:
            yield from _lifecycle_families(gw.fleet)


def _lifecycle_families(fleet):
    """Managed backends (lifecycle/fleet.py): their state now, and their starts and swaps so far.
    The fleet keeps the counts (it is below ops in the layers); they are read here at scrape time."""
    from ..lifecycle.fleet import START_BUCKETS
    from ..lifecycle.swap_policy import UnitState

    state = GaugeMetricFamily("hlf_backend_state", "1 for the state a managed backend is in now.",
                              labels=["backend", "state"])
    starts = CounterMetricFamily("hlf_backend_starts", "Starts (spawns or wakes) of a managed backend by outcome: "
                                 "ok, exit (it exited first), timeout (not ready within start_timeout_s), "
                                 "port_in_use (another process answered at its address), error.",
                                 labels=["backend", "outcome"])
    hist = HistogramMetricFamily("hlf_backend_start_seconds", "From spawn (or wake) to ready, successful starts.",
                                 labels=["backend"])
    swaps = CounterMetricFamily("hlf_backend_swaps", "Times a managed backend was stopped (or put to sleep) "
                                "to make room for another.", labels=["backend"])
    loading = CounterMetricFamily("hlf_backend_load_wait_seconds", "Seconds requests spent waiting for their "
                                  "backend to start (phase loading), summed.", labels=["backend"])
    rounds = CounterMetricFamily("hlf_lifecycle_rounds", "Rounds of the managed backends' loop: each one "
                                 "asks the swap policy about every managed backend (woken by a change in demand, "
                                 "a server's event, an operator's ask, or a time the policy named).")
    rounds.add_metric([], fleet.rounds)
    for name, u in list(fleet.units.items()):
        for s in UnitState:
            state.add_metric([name, s.value], 1 if u.state is s else 0)
        for outcome in ("ok", "exit", "timeout", "port_in_use", "error"):
            starts.add_metric([name, outcome], fleet.starts.get((name, outcome), 0))
        counts = fleet.start_buckets.get(name, [0] * len(START_BUCKETS))
        n = fleet.starts.get((name, "ok"), 0)
        buckets = [(floatToGoString(b), c) for b, c in zip(START_BUCKETS, counts)] + [("+Inf", n)]
        hist.add_metric([name], buckets, fleet.start_sum.get(name, 0.0))
        swaps.add_metric([name], fleet.swaps.get(name, 0))
        loading.add_metric([name], fleet.load_wait_s.get(name, 0.0))
    yield from (state, starts, hist, swaps, loading, rounds)


# -- routes -------------------------------------------------------------------------------------


async def metrics_endpoint(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.may_read_metrics(request):
        return web.json_response(
            {"error": {"type": "authentication_error", "message": "admin key required"}}, status=401)
    body = generate_latest(gw.metrics.registry)
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


async def stats_endpoint(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return web.json_response(
            {"error": {"type": "authentication_error", "message": "admin key required"}}, status=401)
    return web.json_response(gw.metrics.stats())


def add_routes(app: web.Application, gw: OpsGateway) -> None:
    app[OPS_GATEWAY] = gw
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get("/admin/stats", stats_endpoint)

    async def on_startup(app: web.Application) -> None:
        gw.metrics.start()

    async def on_cleanup(app: web.Application) -> None:
        gw.metrics.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

