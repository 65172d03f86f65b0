"""lifecycle/cluster.py says when Redis fails it (WARNING, not DEBUG), once per LOG_EVERY_S while
the failure goes on, and when Redis answers again."""

from __future__ import annotations

import logging

from homelab_frontend.lifecycle import cluster


class _Client:
    def register_script(self, script):
        return script


def test_redis_failures_are_warnings_rate_limited_and_the_recovery_is_said(caplog, monkeypatch):
    coord = cluster.Coordinator(_Client(), "r1", 2.0)
    now = [100.0]
    monkeypatch.setattr(cluster.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="homelab_frontend.lifecycle"):
        for _ in range(10):  # 10 failed rounds within a few seconds: said once
            coord._failed(ConnectionError("Connection refused"))
            now[0] += 0.25
        assert len(caplog.records) == 1 and "ConnectionError: Connection refused" in caplog.records[0].getMessage()
        now[0] += cluster.LOG_EVERY_S
        coord._failed(ConnectionError("Connection refused"))  # still failing: said again, with the count
        assert len(caplog.records) == 2 and "11 failed rounds" in caplog.records[1].getMessage()
        coord._recovered()
        assert "answers again" in caplog.records[2].getMessage()
        coord._recovered()  # nothing to say when nothing failed
        assert len(caplog.records) == 3
    assert all(r.levelno == logging.WARNING for r in caplog.records)
