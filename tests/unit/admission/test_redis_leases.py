"""Slots shared through Redis (admission/redis_leases.py), against a real redis-server: two
registries (two replicas) share one backend's slots; what one holds the other cannot take."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from contextlib import contextmanager

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.redis_leases import DISCOVERY_S, Registry
from homelab_frontend.errors import GatewayError
from redisproc import RedisServer, available

pytestmark = pytest.mark.skipif(not available(), reason="redis-server not installed (.ci/deps)")


@pytest.fixture(scope="module")
def redis_url():
    with RedisServer() as r:
        yield r.url


async def _replicas(url: str, n: int = 2, lease_s: float = 3.0) -> list[Registry]:
    regs = [Registry(cfgmod.Cluster(redis_url=url, lease_s=lease_s, replica_id=f"unit-{i}")) for i in range(n)]
    for r in regs:
        await r.start()
        assert r.ok, r.last_error
    return regs


async def _past_grace(pool) -> None:
    """A Redis with no epoch yet grants nothing for its grace: wait that out once."""
    timeout = pool.queue.timeout_s
    pool.queue.timeout_s = 10
    pool.release(await pool.acquire())
    pool.queue.timeout_s = timeout
    await asyncio.sleep(0.05)


def test_one_slot_shared_by_two_replicas(redis_url):
    async def main():
        a_reg, b_reg = await _replicas(redis_url)
        try:
            a = a_reg.pool("shared-1", 1, 4, 0.5)
            b = b_reg.pool("shared-1", 1, 4, 0.5)
            await _past_grace(a)
            la = await a.acquire()
            with pytest.raises(GatewayError) as e:  # b waits its queue timeout: the slot is a's
                await b.acquire()
            assert e.value.kind == "overloaded"
            waiter = asyncio.get_running_loop().create_task(b.acquire())
            await asyncio.sleep(0.1)
            assert not waiter.done()
            a.release(la)
            lb = await asyncio.wait_for(waiter, 3)  # handed over across replicas
            b.release(lb)
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
        (reg,) = await _replicas(url, 1, lease_s=30.0)
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
        a_reg, b_reg = await _replicas(server.url, 2, lease_s=30.0)
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
        (reg,) = await _replicas(server.url, 1, lease_s=30.0)
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
        (reg,) = await _replicas(server.url, 1, lease_s=60.0)
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


class _Record:
    """A request record as admission sees it (lease.Holder)."""

    def __init__(self, rid: str) -> None:
        self.id, self.phase, self.load_wait = rid, "queued", 0.0
        self.cancelled: list[tuple[str, str]] = []

    def cancel(self, reason: str, message: str = "") -> bool:
        self.cancelled.append((reason, message))
        return True


def test_a_lease_taken_in_another_task_is_still_the_requests_and_release_frees_only_it():
    """A slot taken inside `asyncio.wait_for` (its own task on Python 3.11) belongs to the request
    whose record was passed in: its member names it, `release(lease)` frees exactly it, and when
    Redis is lost the fencing stops that request."""
    async def main(server):
        redis_url = server.url
        (reg,) = await _replicas(redis_url, 1, lease_s=2.0)
        try:
            pool = reg.pool("handle-1", 2, 4, 5)
            await _past_grace(pool)
            r1, r2 = _Record("req-one"), _Record("req-two")
            l1 = await asyncio.wait_for(pool.acquire("k", 0, r1), 5)
            l2 = await pool.acquire("k", 0, r2)
            assert l1.holder is r1 and l1.member == "unit-0:req-one"
            pool.release(l2)
            pool.release(l2)  # once only
            await asyncio.sleep(0.2)
            assert RedisServer_members(redis_url, "handle-1") == ["unit-0:req-one"]
            # Redis gone for longer than the lease: the request holding l1 is stopped
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            for _ in range(100):
                if r1.cancelled:
                    break
                await asyncio.sleep(0.05)
            assert r1.cancelled and r1.cancelled[0][0] == "slot_lost" and "lease" in r1.cancelled[0][1]
            assert not r2.cancelled
            pool.release(l1)
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server))


def RedisServer_members(url: str, backend: str) -> list[str]:
    import redis

    return redis.Redis.from_url(url, decode_responses=True).zrange(f"hlf:slots:{backend}", 0, -1)


def test_a_cancellation_the_awaited_call_swallowed_is_raised_again():
    # what Python 3.11's asyncio.wait_for (inside redis-py) does when the call finished by the
    # time the cancellation arrives: it returns the result and the cancellation is gone
    from homelab_frontend.admission.redis_leases import kept_cancel

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


def test_a_request_cancelled_during_its_redis_calls_stops(redis_url):
    # redis-py on Python 3.11 lost almost every such cancellation (299 of 300 PINGs); through
    # Registry.call none may be lost, whenever it lands
    async def main():
        (reg,) = await _replicas(redis_url, 1)
        pool = reg.pool("cancel-1", 1, 4, 0.5)
        lost = 0
        try:
            for i in range(100):
                async def loop():
                    for _ in range(300):  # ~0.1 s: far longer than the cancel's delay
                        await reg.live(pool)
                task = asyncio.get_running_loop().create_task(loop())
                await asyncio.sleep((i % 10) / 3000)
                task.cancel()
                try:
                    await task
                    lost += 1
                except asyncio.CancelledError:
                    pass
        finally:
            await reg.close()
        return lost

    assert asyncio.run(main()) == 0


# -- late is not gone -----------------------------------------------------------------------------


def test_redis_counts_as_gone_after_half_a_lease_and_a_quick_call_never_waits_longer():
    from homelab_frontend.admission.redis_leases import QUICK_MIN_S, gone_after, quick_bound

    assert gone_after(10) == 5 and gone_after(8) == 4 and gone_after(4) == 2
    assert quick_bound(10) == 1 and quick_bound(2) == 0.5
    assert gone_after(0.1) == quick_bound(0.1) == QUICK_MIN_S
    for lease_s in (0.1, 0.5, 1, 2, 3, 4, 8, 10, 30, 600):
        assert QUICK_MIN_S <= quick_bound(lease_s) <= gone_after(lease_s)
    for lease_s in (1, 2, 4, 10, 600):
        # a lease renewed just before the silence (every lease_s / 3) outlives the wait for Redis
        # by more than the fencing margin (min(0.5, lease_s / 10)): the stop still lands in time
        assert lease_s / 3 + gone_after(lease_s) < lease_s - min(0.5, lease_s / 10)


@contextmanager
def _paused(server: RedisServer, for_s: float):
    """redis-server stopped for `for_s` from now (resumed by a timer, and in any case on exit)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    timer = threading.Timer(for_s, os.kill, (server.proc.pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.kill(server.proc.pid, signal.SIGCONT)


def test_a_late_redis_is_waited_for_and_a_silent_one_is_gone():
    async def main(server: RedisServer):
        (reg,) = await _replicas(server.url, 1, lease_s=2.0)  # gone after 1 s of silence
        pool = reg.pool("late-1", 2, 4, 10)
        try:
            await _past_grace(pool)
            with _paused(server, 0.5):
                lease = await pool.acquire()  # answered late: taken, Redis still up
            assert reg.ok and reg.last_error is None
            pool.release(lease)
            with _paused(server, 3.0):
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


def _zadds(server: RedisServer) -> int:
    """ZADDs Redis has run (scripts' too): one per slot taken, here where nothing is renewed."""
    return server.client().info("commandstats").get("cmdstat_zadd", {}).get("calls", 0)


def test_a_take_abandoned_in_a_paused_redis_leaves_no_lease_once_it_resumes():
    async def main(server: RedisServer):
        (reg,) = await _replicas(server.url, 1, lease_s=4.0)  # gone after 2 s
        pool = reg.pool("ghost-1", 2, 4, 1.2)  # the request waits its queue timeout, 1.2 s
        try:
            await _past_grace(pool)
            pool.release(await pool.acquire())  # a pooled connection: the script is sent at once
            await asyncio.sleep(0.05)
            zadds = _zadds(server)
            with _paused(server, 1.6):
                with pytest.raises(GatewayError) as e:
                    await pool.acquire()
                assert "did not answer within 1.2 s" in e.value.message
                assert reg.ok  # the request's own budget ran out, not Redis's
            # the take runs when Redis resumes, and the release sent after it runs after it
            for _ in range(800):
                if _zadds(server) > zadds and not RedisServer_members(server.url, "ghost-1"):
                    break
                await asyncio.sleep(0.01)
            assert _zadds(server) == zadds + 1  # the abandoned take did run
            assert RedisServer_members(server.url, "ghost-1") == []
            assert reg.ok and pool.held == 0
        finally:
            await reg.close()

    with RedisServer() as server:
        asyncio.run(main(server))
