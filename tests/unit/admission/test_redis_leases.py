"""Slots shared through Redis (admission/redis_leases.py), against a real redis-server: two
registries (two replicas) share one backend's slots; what one holds the other cannot take."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.redis_leases import Registry
from homelab_frontend.errors import GatewayError
from redisproc import RedisServer, available

pytestmark = pytest.mark.skipif(not available(), reason="redis-server not installed (.ci/deps)")


@pytest.fixture(scope="module")
def redis_url():
    with RedisServer() as r:
        yield r.url


async def _replicas(url: str, n: int = 2, lease_s: float = 3.0) -> list[Registry]:
    regs = [Registry(cfgmod.Cluster(redis_url=url, lease_s=lease_s, replica_id=f"unit-{i}"), []) for i in range(n)]
    for r in regs:
        await r.start()
        assert r.ok, r.last_error
    return regs


async def _past_grace(pool) -> None:
    """A Redis with no epoch yet grants nothing for one lease: wait that out once."""
    timeout = pool.timeout_s
    pool.timeout_s = 10
    await pool.acquire()
    pool.release()
    pool.timeout_s = timeout
    await asyncio.sleep(0.05)


def test_one_slot_shared_by_two_replicas(redis_url):
    async def main():
        a_reg, b_reg = await _replicas(redis_url)
        try:
            a = a_reg.pool("shared-1", 1, 4, 0.5)
            b = b_reg.pool("shared-1", 1, 4, 0.5)
            await _past_grace(a)
            await a.acquire()
            with pytest.raises(GatewayError) as e:  # b waits its queue timeout: the slot is a's
                await b.acquire()
            assert e.value.kind == "overloaded"
            waiter = asyncio.get_running_loop().create_task(b.acquire())
            await asyncio.sleep(0.1)
            assert not waiter.done()
            a.release()
            await asyncio.wait_for(waiter, 3)  # handed over across replicas
            b.release()
        finally:
            for r in (a_reg, b_reg):
                await r.close()

    asyncio.run(main())


def test_view_counts_every_replicas_holders(redis_url):
    async def main():
        a_reg, b_reg = await _replicas(redis_url)
        try:
            a = a_reg.pool("shared-2", 3, 4, 2)
            b = b_reg.pool("shared-2", 3, 4, 2)
            await _past_grace(a)
            await a.acquire()
            await b.acquire()
            await b.acquire()
            view = await a_reg.view()
            assert view is not None
            a.release(); b.release(); b.release()
        finally:
            for r in (a_reg, b_reg):
                await r.close()
        return view

    view = asyncio.run(main())
    b = view["backends"]["shared-2"]
    assert view["reachable"] and view["replica"] == "unit-0"
    assert (b["slots"], b["in_use"], b["held_here"], b["replicas"]) == (3, 3, 1, {"unit-0": 1, "unit-1": 2})
    assert sorted(lease["replica"] for lease in b["leases"]) == ["unit-0", "unit-1", "unit-1"]
