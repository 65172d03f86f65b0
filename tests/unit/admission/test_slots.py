"""The slot pool's admission rules, driven directly on an event loop."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend.errors import GatewayError
from homelab_frontend.admission.slots import SlotPool


def run(coro):
    return asyncio.run(coro)


def test_fast_path_and_release():
    async def main():
        p = SlotPool("b", 2, 4, 1.0)
        first = await p.acquire()
        held = await p.acquire()
        assert p.in_use == 2 and p.queued == 0
        p.release(first)
        assert p.in_use == 1
        p.release(first)  # a lease is given back once: the second release is a no-op
        assert p.in_use == 1
    run(main())


def test_full_queue_is_refused_with_retry_after():
    async def main():
        p = SlotPool("b", 1, 1, 5.0)
        held = await p.acquire()
        waiter = asyncio.create_task(p.acquire())
        await asyncio.sleep(0)
        assert p.queued == 1
        with pytest.raises(GatewayError) as ei:
            await p.acquire()
        assert ei.value.kind == "overloaded" and ei.value.retry_after >= 1
        assert "queue depth 1" in ei.value.message
        p.release(held)
        await waiter
        assert p.in_use == 1 and p.queued == 0
    run(main())


def test_queue_timeout():
    async def main():
        p = SlotPool("b", 1, 4, 0.05)
        held = await p.acquire()
        with pytest.raises(GatewayError) as ei:
            await p.acquire()
        assert ei.value.kind == "overloaded" and "0.05 s" in ei.value.message
        assert p.queued == 0 and p.in_use == 1
    run(main())


def test_cancelled_waiter_leaves_the_queue_and_never_leaks():
    async def main():
        p = SlotPool("b", 1, 4, 5.0)
        held = await p.acquire()
        w = asyncio.create_task(p.acquire())
        await asyncio.sleep(0)
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        assert p.queued == 0
        p.release(held)
        assert p.in_use == 0
    run(main())


def test_granted_then_cancelled_gives_the_slot_back():
    async def main():
        p = SlotPool("b", 1, 4, 5.0)
        held = await p.acquire()
        w = asyncio.create_task(p.acquire())
        await asyncio.sleep(0)
        p.release(held)  # grants to w ...
        w.cancel()  # ... which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await w
        assert p.in_use == 0 and p.queued == 0
    run(main())


def test_round_robin_between_keys_and_priority_first():
    async def main():
        p = SlotPool("b", 1, 100, 5.0)
        held = await p.acquire()
        order: list[str] = []

        async def one(key, prio=0):
            lease = await p.acquire(key, prio)
            order.append(key)
            await asyncio.sleep(0)
            p.release(lease)

        tasks = [asyncio.create_task(one("burst")) for _ in range(5)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("other")))
        tasks.append(asyncio.create_task(one("vip", 5)))
        await asyncio.sleep(0)
        p.release(held)
        await asyncio.gather(*tasks)
        assert order[0] == "vip"  # priority first
        assert order.index("other") <= 2  # not behind the whole burst
    run(main())


def test_resize_grants_new_slots_at_once():
    async def main():
        p = SlotPool("b", 1, 4, 5.0)
        held = await p.acquire()
        w = asyncio.create_task(p.acquire())
        await asyncio.sleep(0)
        p.resize(2, 4, 5.0)
        await asyncio.wait_for(w, 1)
        assert p.in_use == 2
    run(main())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(1, 4))
def test_never_more_than_slots_and_nothing_leaks(plan, slots):
    """Random arrivals, holds and cancellations: in_use never exceeds slots, and ends at 0."""
    async def main():
        p = SlotPool("b", slots, 1000, 10.0)
        peak = 0

        async def req(hold_ticks, cancel, key):
            nonlocal peak
            lease = await p.acquire(str(key))
            try:
                peak = max(peak, p.in_use)
                for _ in range(hold_ticks):
                    await asyncio.sleep(0)
            finally:
                p.release(lease)

        tasks = []
        for hold, cancel, key in plan:
            t = asyncio.create_task(req(hold, cancel, key))
            tasks.append((t, cancel))
            await asyncio.sleep(0)
        for t, cancel in tasks:
            if cancel:
                t.cancel()
        await asyncio.gather(*(t for t, _ in tasks), return_exceptions=True)
        assert peak <= slots
        assert p.in_use == 0 and p.queued == 0
    run(main())
