"""lifecycle/cluster.py says when Redis fails it (WARNING, not DEBUG), once per LOG_EVERY_S while
the failure goes on, and when Redis answers again; and its loop ends on close() even when
redis-py loses the cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading

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


class _Swallowing(_Client):
    """Redis calls that complete even when their task is cancelled meanwhile, as redis-py's
    `wait_for` does on Python 3.11 when the answer and the cancellation arrive together."""

    def __init__(self) -> None:
        self.calls = 0

    async def _call(self, result):
        self.calls += 1
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            pass  # the cancellation is gone, the answer returned
        return result

    async def set(self, *args, **kwargs):
        return await self._call(False)

    async def get(self, *args, **kwargs):
        return await self._call(None)

    async def mget(self, *args, **kwargs):
        return await self._call([None, None])

    def pipeline(self, transaction=False):
        client = self

        class _Pipe:
            def __getattr__(self, name):
                return lambda *a, **k: None

            async def execute(self):
                return await client._call([])
        return _Pipe()


class _Fleet:
    units: dict = {}

    def mirror(self, states):
        pass


def test_close_returns_even_when_redis_py_swallows_the_cancellation(monkeypatch):
    """The coordinator's loop is cancelled mid-call, the call swallows it: close() must still
    return (a gateway's shutdown waited on it for good). Run in a thread of its own, so that a
    close that never returns fails the test instead of hanging the worker."""
    monkeypatch.setattr(cluster, "POLL_S", 0.0)  # always inside a Redis call, as in a busy loop
    closed = threading.Event()

    async def main():
        client = _Swallowing()
        coord = cluster.Coordinator(client, "r1", 2.0)
        coord.start(_Fleet())
        while client.calls < 5:
            await asyncio.sleep(0.005)
        await coord.close()
        assert coord._task.done()
        closed.set()

    threading.Thread(target=asyncio.run, args=(main(),), daemon=True).start()
    assert closed.wait(30), "close() did not return: the loop lost its cancellation and ran on"
