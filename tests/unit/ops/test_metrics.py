"""Metrics (ops/metrics.py): a finished request counted once by its outcome, live gauges read
from the gateway's state at scrape time, the dashboard's numbers."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.ops.metrics import Metrics
from homelab_frontend.request.tracker import Tracked


def _with_gateway(tmp_path, fn):
    async def main():
        gw = Gateway(cfgmod.parse({
            "backends": {"gpu0": {"url": "http://127.0.0.1:9/v1", "slots": 2}},
            "models": {"m": {"backend": "gpu0"}},
            "responses": {"store": {"path": str(tmp_path / "r.sqlite3")}},
        }))
        try:
            return fn(gw, Tracked("req_m", "anthropic", "m", None, True))
        finally:
            await gw.close()

    return asyncio.run(main())


def test_observed_requests_are_counted_by_outcome(tmp_path):
    def fn(gw, t):
        assert isinstance(gw.metrics, Metrics)
        t.backend, t.status = "gpu0", 200
        t.tokens_in, t.tokens_out = 7, 9
        t.fail("upstream_midstream")
        gw.metrics.observe(t)
        return generate_latest(gw.metrics.registry).decode(), gw.metrics.stats()

    text, stats = _with_gateway(tmp_path, fn)
    line = next(ln for ln in text.splitlines() if ln.startswith("hlf_requests_total{"))
    assert 'outcome="error_upstream_midstream"' in line and 'backend="gpu0"' in line and line.endswith(" 1.0")
    assert "hlf_upstream_errors_total{" in text
    assert stats["backends"]["gpu0"]["configured"] is True


def test_live_gauges_are_read_at_scrape_time(tmp_path):
    def fn(gw, t):
        before = generate_latest(gw.metrics.registry).decode()
        gw.backends["gpu0"].pool.in_use = 2
        t.backend = "gpu0"
        t.connecting(), t.answering(stream=True), t.streaming()
        gw.tracker.add(t)
        return before, generate_latest(gw.metrics.registry).decode()

    before, after = _with_gateway(tmp_path, fn)
    assert 'hlf_backend_slots{backend="gpu0"} 2.0' in before
    assert 'hlf_backend_slots_in_use{backend="gpu0"} 0.0' in before
    assert 'hlf_backend_slots_in_use{backend="gpu0"} 2.0' in after
    assert 'hlf_requests_in_flight{backend="gpu0",phase="streaming"} 1.0' in after
