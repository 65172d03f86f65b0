"""Two or more gateway replicas sharing slots through a real redis-server, for the unit tests of
admission/redis_registry.py and admission/redis_slot_pool.py."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from contextlib import contextmanager

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.redis_registry import Registry
from redisproc import RedisServer


async def replicas(url: str, n: int = 2, lease_s: float = 3.0) -> list[Registry]:
    regs = [Registry(cfgmod.Cluster(redis_url=url, lease_s=lease_s, replica_id=f"unit-{i}")) for i in range(n)]
    for r in regs:
        await r.start()
        assert r.ok, r.last_error
    return regs


async def past_grace(pool) -> None:
    """A Redis with no epoch yet grants nothing for its grace: wait that out once."""
    timeout = pool.queue.timeout_s
    pool.queue.timeout_s = 10
    pool.release(await pool.acquire())
    pool.queue.timeout_s = timeout
    await asyncio.sleep(0.05)


@contextmanager
def paused(server: RedisServer, for_s: float):
    """redis-server stopped for `for_s` from now (resumed by a timer, and in any case on exit)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    timer = threading.Timer(for_s, os.kill, (server.proc.pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.kill(server.proc.pid, signal.SIGCONT)
