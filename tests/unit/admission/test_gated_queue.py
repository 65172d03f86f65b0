"""One queue for a backend that does not always admit (a managed one): the slot pool's WaitQueue
with a scripted Gate. The fast path, waiting while loading without the queue clock, grants as the
gate opens and slots allow, failures, timeouts, and a waiter that leaves."""

from __future__ import annotations

import asyncio
import time

import pytest

from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError


class Rec:
    def __init__(self, rid: str = "r") -> None:
        self.id, self.phase, self.load_wait = rid, "queued", 0.0

    def queued(self) -> None:
        self.phase = "queued"

    def loading(self) -> None:
        self.phase = "loading"

    def cancel(self, reason: str, message: str = "") -> bool:
        return False


class Gate:
    def __init__(self) -> None:
        self.open = False
        self.refuse: GatewayError | None = None
        self.changes = 0
        self.eta = 7.0

    def admits(self) -> bool:
        return self.open

    def refusal(self):
        return self.refuse

    def changed(self) -> None:
        self.changes += 1

    def load_s(self) -> float:
        return self.eta


def make(slots=1, depth=4, timeout_s=0.2):
    pool = SlotPool("a", slots, depth, timeout_s)
    gate = pool.queue.gate = Gate()
    return gate, pool


def test_open_and_nobody_waiting_is_the_fast_path():
    async def go():
        gate, pool = make()
        gate.open = True
        lease = await pool.acquire()
        assert pool.in_use == 1 and pool.queued == 0 and pool.expected_wait_s() > 0
        pool.release(lease, 0.1)
        assert pool.in_use == 0 and pool.expected_wait_s() == 0
    asyncio.run(go())


def test_a_shut_gate_adds_the_load_time_to_the_expected_wait():
    async def go():
        gate, pool = make()
        assert pool.expected_wait_s() == 7.0  # free slots, nobody waiting: only the load
        gate.open = True
        assert pool.expected_wait_s() == 0.0
    asyncio.run(go())


def test_waits_in_phase_loading_past_the_queue_timeout_then_is_granted():
    async def go():
        gate, pool = make(timeout_s=0.1)
        rec = Rec()
        pool.queue.set_loading(True)
        task = asyncio.create_task(pool.acquire("k", 0, rec))
        await asyncio.sleep(0.05)
        assert rec.phase == "loading" and pool.queued == 1 and gate.changes >= 1
        await asyncio.sleep(0.4)  # four queue timeouts: still waiting, the clock stands still
        assert not task.done()
        gate.open = True
        pool.queue.set_loading(False)
        pool.grant()
        lease = await asyncio.wait_for(task, 1)
        assert lease.holder is rec and pool.in_use == 1 and rec.phase == "queued"
        assert rec.load_wait >= 0.4 and pool.queue.load_wait_s >= 0.4
    asyncio.run(go())


def test_the_clock_runs_while_waiting_for_the_gate_and_resumes_with_what_was_left():
    """Judged by the waiter's own clock (its budget and its timer's deadline), bracketed by the
    test's readings: no wall-clock floor a busy machine could miss."""
    async def go():
        loop = asyncio.get_running_loop()
        gate, pool = make(timeout_s=30)
        t0 = time.monotonic()
        task = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0.05)  # some of the budget spent
        w = pool.queue.peek()
        assert w is not None and w.timer is not None
        pool.queue.set_loading(True)
        t1 = time.monotonic()
        left = w.budget
        assert 30 - (t1 - t0) <= left <= 30 - 0.05 and w.timer is None  # spent what ran, then stopped
        await asyncio.sleep(0.2)
        assert w.budget == left and w.timer is None and not task.done()  # loading: the clock stands still
        r0 = loop.time()
        pool.queue.set_loading(False)
        r1 = loop.time()
        assert w.timer is not None and r0 + left <= w.timer.when() <= r1 + left  # resumed with what was left
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert pool.queued == 0
    asyncio.run(go())


def test_a_waiter_whose_clock_runs_out_is_refused_as_overloaded():
    async def go():
        gate, pool = make(timeout_s=0.1)
        with pytest.raises(GatewayError) as ei:
            await asyncio.wait_for(pool.acquire(), 30)
        assert ei.value.kind == "overloaded" and "0.1 s" in ei.value.message and pool.queued == 0
    asyncio.run(go())


def test_a_failed_start_answers_every_waiter_at_once_and_the_back_off_refuses():
    async def go():
        gate, pool = make(depth=8, timeout_s=30)
        pool.queue.set_loading(True)
        tasks = [asyncio.create_task(pool.acquire(f"k{i}")) for i in range(3)]
        await asyncio.sleep(0.02)
        err = GatewayError("backend_down", "backend 'a' failed to start: exit status 1", status=503, retry_after=5)
        pool.queue.fail_all(err)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is err for r in results) and pool.queued == 0
        gate.refuse = err  # the back-off: refused before queueing
        with pytest.raises(GatewayError):
            await pool.acquire()
        assert pool.queued == 0
    asyncio.run(go())


def test_grants_only_as_the_gate_and_slots_allow_and_a_full_queue_refuses():
    async def go():
        gate, pool = make(slots=1, depth=2, timeout_s=30)
        a = asyncio.create_task(pool.acquire("a"))
        b = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.01)
        with pytest.raises(GatewayError) as ei:
            await pool.acquire("c")
        assert "queue depth 2" in ei.value.message
        pool.grant()  # shut: nobody
        assert pool.in_use == 0
        gate.open = True
        pool.grant()
        await asyncio.sleep(0.01)
        assert a.done() and not b.done() and pool.in_use == 1
        pool.release(a.result(), 0.1)
        await asyncio.wait_for(b, 1)
        assert pool.in_use == 1
    asyncio.run(go())


def test_a_waiter_that_leaves_is_forgotten_and_its_owner_told():
    async def go():
        gate, pool = make(timeout_s=30)
        t = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0.01)
        changes = gate.changes
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert pool.queued == 0 and gate.changes > changes and pool.in_use == 0
    asyncio.run(go())
