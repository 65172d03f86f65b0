"""The gate in front of a managed backend's slots (lifecycle/gate.py), with a scripted host:
the fast path, waiting while loading without the queue clock, fair grants, failures, timeouts."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.lifecycle.gate import ManagedPool


class Rec:
    phase = "queued"
    load_wait = 0.0


class Host:
    def __init__(self) -> None:
        self.ready = False
        self.is_loading = False
        self.refuse: GatewayError | None = None
        self.kicks = 0
        self.records: dict = {}
        self.loaded_s = 0.0

    def admits(self, name):
        return self.ready

    def loading(self, name):
        return self.is_loading

    def refusal(self, name):
        return self.refuse

    def kick(self):
        self.kicks += 1

    def record_for(self, task):
        return self.records.get(task)

    def touched(self, name):
        pass

    def waited_loading(self, name, seconds):
        self.loaded_s += seconds


def make(slots=1, depth=4, timeout_s=0.2):
    host = Host()
    return host, ManagedPool("a", SlotPool("a", slots, depth, timeout_s), host)


def test_ready_and_nobody_waiting_is_the_fast_path():
    async def go():
        host, pool = make()
        host.ready = True
        await pool.acquire()
        assert pool.in_use == 1 and pool.queued == 0 and host.kicks == 0
        pool.release(0.1)
        assert pool.in_use == 0
    asyncio.run(go())


def test_waits_in_phase_loading_past_the_queue_timeout_then_is_granted():
    async def go():
        host, pool = make(timeout_s=0.1)
        rec = Rec()

        async def req():
            host.records[asyncio.current_task()] = rec
            await pool.acquire("k", 0)

        host.is_loading = True
        task = asyncio.create_task(req())
        await asyncio.sleep(0.05)
        pool.loading_changed()
        assert rec.phase == "loading" and pool.queued == 1 and host.kicks >= 1
        await asyncio.sleep(0.4)  # four queue timeouts: still waiting, the clock is suspended
        assert not task.done()
        host.is_loading, host.ready = False, True
        pool.loading_changed()
        pool.grant()
        await asyncio.wait_for(task, 1)
        assert pool.in_use == 1 and rec.phase == "queued" and host.loaded_s >= 0.4
        assert rec.load_wait >= 0.4  # the request's own record says how long it waited for the load
    asyncio.run(go())


def test_the_queue_clock_runs_while_waiting_for_room():
    async def go():
        host, pool = make(timeout_s=0.1)
        with pytest.raises(GatewayError) as ei:
            await pool.acquire()
        assert ei.value.kind == "overloaded" and pool.queued == 0
    asyncio.run(go())


def test_a_failed_start_answers_every_waiter_at_once():
    async def go():
        host, pool = make(depth=8, timeout_s=30)
        host.is_loading = True
        tasks = [asyncio.create_task(pool.acquire(f"k{i}")) for i in range(3)]
        await asyncio.sleep(0.02)
        err = GatewayError("backend_down", "backend 'a' failed to start: exit status 1", status=503, retry_after=5)
        pool.fail_all(err)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is err for r in results) and pool.queued == 0
        host.refuse = err  # the back-off: refused before queueing
        with pytest.raises(GatewayError):
            await pool.acquire()
        assert pool.queued == 0
    asyncio.run(go())


def test_grants_only_as_slots_allow_and_a_full_gate_refuses():
    async def go():
        host, pool = make(slots=1, depth=2, timeout_s=30)
        a = asyncio.create_task(pool.acquire("a"))
        b = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.01)
        with pytest.raises(GatewayError) as ei:
            await pool.acquire("c")
        assert "queue depth 2" in ei.value.message
        host.ready = True
        pool.grant()
        await asyncio.sleep(0.01)
        assert a.done() and not b.done() and pool.in_use == 1 and pool.busy() == 1
        pool.release(0.1)
        await asyncio.wait_for(b, 1)
        assert pool.in_use == 1
    asyncio.run(go())


def test_a_waiter_that_leaves_is_forgotten():
    async def go():
        host, pool = make(timeout_s=30)
        t = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0.01)
        kicks = host.kicks
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert pool.queued == 0 and host.kicks > kicks and pool.busy() == 0
    asyncio.run(go())
