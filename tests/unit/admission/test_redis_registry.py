"""The slot registry (admission/redis_registry.py) against a real redis-server: what two replicas
see of each other's leases, the epoch's grace after Redis came back empty, and when a late Redis
counts as gone."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend.admission.redis_registry import DISCOVERY_S
from homelab_frontend.errors import GatewayError
from redisproc import RedisServer, available
from support.redis_cluster import past_grace, paused, replicas

pytestmark = pytest.mark.skipif(not available(), reason="redis-server not installed (.ci/deps)")

@pytest.fixture(scope="module")
def redis_url():
    with RedisServer() as r:
        yield r.url


def test_view_counts_every_replicas_holders(redis_url):
    async def main():
        a_reg, b_reg = await replicas(redis_url)
        try:
            a = a_reg.pool("shared-2", 3, 4, 2)
            b = b_reg.pool("shared-2", 3, 4, 2)
            await past_grace(a)
            la = await a.acquire()
            lb1 = await b.acquire()
            lb2 = await b.acquire()
            view = await a_reg.view()
            assert view is not None
            a.release(la); b.release(lb1); b.release(lb2)
        finally:
            for r in (a_reg, b_reg):
                await r.close()
        return view

    view = asyncio.run(main())
    b = view["backends"]["shared-2"]
    assert view["reachable"] and view["replica"] == "unit-0"
    assert (b["slots"], b["in_use"], b["held_here"], b["replicas"]) == (3, 3, 1, {"unit-0": 1, "unit-1": 2})
    assert sorted(lease["replica"] for lease in b["leases"]) == ["unit-0", "unit-1", "unit-1"]


def _epoch(server) -> tuple[int, int]:
    end, born = server.client().get("hlf:epoch").split()
    return int(end), int(born)


def test_a_fresh_cluster_waits_only_the_discovery_window():
    # no replica holds a slot: nothing can have been lost, the grace is DISCOVERY_S, not lease_s
    async def main(url):
        (reg,) = await replicas(url, 1, lease_s=30.0)
        try:
            pool = reg.pool("fresh-1", 2, 4, 10)
            lease = await pool.acquire()  # after the window's second, not the lease's 30 (the queue timeout is 10)
            assert pool.held == 1
            pool.release(lease)
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server.url))
        end, born = _epoch(server)
        assert end - born == int(DISCOVERY_S * 1000)


def test_a_redis_that_lost_its_leases_waits_the_whole_grace():
    async def main(server):
        a_reg, b_reg = await replicas(server.url, 2, lease_s=30.0)
        try:
            a = a_reg.pool("lost-1", 2, 4, 10)
            b = b_reg.pool("lost-1", 2, 4, 0.3)
            la = await a.acquire()  # past the fresh cluster's discovery window; a holds a slot
            server.client().flushall()  # Redis forgets every lease, as after a restart without persistence
            # a replica that holds nothing finds the empty Redis first: only the discovery window...
            with pytest.raises(GatewayError):
                await b.acquire()
            end, born = _epoch(server)
            assert end - born == int(DISCOVERY_S * 1000)
            # ...until the holder re-registers its lost lease: then the whole lease_s from the start
            await a_reg._renew_all()
            end, born = _epoch(server)
            assert end - born == a_reg.lease_ms
            assert server.client().zrange("hlf:slots:lost-1", 0, -1) == list(a._held)  # re-registered
            assert b_reg.grace_s() is None or b_reg.grace_s() <= DISCOVERY_S  # b has not asked since
            with pytest.raises(GatewayError):
                await b.acquire()  # the grace holds: nobody else gets the slot a still runs on
            assert b_reg.grace_s() > DISCOVERY_S
            a.release(la)
        finally:
            for r in (a_reg, b_reg):
                await r.close()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_a_holder_first_on_an_empty_redis_sets_the_whole_grace_at_once():
    async def main(server):
        (reg,) = await replicas(server.url, 1, lease_s=30.0)
        try:
            pool = reg.pool("lost-2", 2, 4, 10)
            lease = await pool.acquire()
            server.client().flushall()
            await reg._renew_all()
            end, born = _epoch(server)
            assert end - born == reg.lease_ms
            pool.release(lease)
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_after_a_restart_the_listener_has_held_slots_re_registered_at_once():
    # lease 60 s: the maintainer's own round would come only after 20 s
    async def main(server):
        (reg,) = await replicas(server.url, 1, lease_s=60.0)
        try:
            pool = reg.pool("restart-1", 2, 4, 10)
            lease = await pool.acquire()
            await asyncio.sleep(0.3)  # the listener is subscribed
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            await asyncio.get_running_loop().run_in_executor(None, server.start)
            for _ in range(100):  # up to 10 s, well before the 20 s renewal round
                if server.client().zrange("hlf:slots:restart-1", 0, -1):
                    break
                await asyncio.sleep(0.1)
            assert server.client().zrange("hlf:slots:restart-1", 0, -1) == pool.members()
            end, born = _epoch(server)
            assert end - born == reg.lease_ms  # re-registered by a holder: the whole grace
            pool.release(lease)
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server))


def test_a_cancellation_the_awaited_call_swallowed_is_raised_again():
    # what Python 3.11's asyncio.wait_for (inside redis-py) does when the call finished by the
    # time the cancellation arrives: it returns the result and the cancellation is gone
    from homelab_frontend.admission.redis_registry import kept_cancel

    async def swallows(started: asyncio.Event):
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "result"

    async def cancelled(wrap):
        started = asyncio.Event()
        task = asyncio.get_running_loop().create_task(wrap(swallows(started)))
        await started.wait()
        task.cancel()
        return (await asyncio.gather(task, return_exceptions=True))[0]

    assert asyncio.run(cancelled(lambda c: c)) == "result"
    assert isinstance(asyncio.run(cancelled(kept_cancel)), asyncio.CancelledError)


def test_redis_counts_as_gone_after_half_a_lease_and_a_quick_call_never_waits_longer():
    from homelab_frontend.admission.redis_registry import QUICK_MIN_S, gone_after, quick_bound

    assert gone_after(10) == 5 and gone_after(8) == 4 and gone_after(4) == 2
    assert quick_bound(10) == 1 and quick_bound(2) == 0.5
    assert gone_after(0.1) == quick_bound(0.1) == QUICK_MIN_S
    for lease_s in (0.1, 0.5, 1, 2, 3, 4, 8, 10, 30, 600):
        assert QUICK_MIN_S <= quick_bound(lease_s) <= gone_after(lease_s)
    for lease_s in (1, 2, 4, 10, 600):
        # a lease renewed just before the silence (every lease_s / 3) outlives the wait for Redis
        # by more than the fencing margin (min(0.5, lease_s / 10)): the stop still lands in time
        assert lease_s / 3 + gone_after(lease_s) < lease_s - min(0.5, lease_s / 10)


def test_a_late_redis_is_waited_for_and_a_silent_one_is_gone():
    async def main(server: RedisServer):
        (reg,) = await replicas(server.url, 1, lease_s=2.0)  # gone after 1 s of silence
        pool = reg.pool("late-1", 2, 4, 10)
        try:
            await past_grace(pool)
            with paused(server, 0.5):
                lease = await pool.acquire()  # answered late: taken, Redis still up
            assert reg.ok and reg.last_error is None
            pool.release(lease)
            with paused(server, 3.0):
                with pytest.raises(GatewayError) as e:
                    await pool.acquire()
                assert e.value.kind == "overloaded" and "Redis" in e.value.message
                assert not reg.ok and reg.last_error == "no answer for 1 s"
            for _ in range(500):
                if reg.ok:
                    break
                await asyncio.sleep(0.01)
            assert reg.ok
            pool.release(await pool.acquire())
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server))
