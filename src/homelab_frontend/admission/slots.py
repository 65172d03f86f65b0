"""Admission control: a backend's sequence slots and the bounded queue in front of them.

A request holds one slot from admission until its last byte is written or its cancellation is
complete, so the backend never runs more sequences for us than its `slots`. When none is free the
request waits in a bounded queue, FIFO within an API key but round-robin between keys (one key's
burst cannot starve another) and by key priority first (the order: fair_queue.py, pure). A full queue, or a wait past the queue's
timeout, is refused as `overloaded` with a Retry-After estimated from recent slot hold times.

Two slot stores, one queue: `WaitQueue` is the part they share (the bounded fair queue, the
queue timeout, what a waiter that leaves must undo, the hold-time estimate behind Retry-After and
routing's expected wait); each store owns one and decides only how a slot is taken and given back.
`SlotPool` keeps the count in process: the fast path (a free slot, nobody waiting) is a counter
increment, and a release hands its slot to the next waiter synchronously.
`redis_leases.RedisSlotPool` takes slots as Redis leases, an await, by a granter task of its own.
"""

from __future__ import annotations

import asyncio
import math
from typing import Callable

from ..errors import GatewayError
from .fair_queue import FairQueue


class _Waiter:
    __slots__ = ("fut", "key", "priority")

    def __init__(self, fut: asyncio.Future, key: str, priority: int) -> None:
        self.fut = fut
        self.key = key
        self.priority = priority


def granted(fut: asyncio.Future) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


class WaitQueue:
    """The bounded fair queue in front of one backend's slots, for either slot store.

    It decides who is next (fair_queue.py) and how long one may wait; it never takes a slot:
    the store grants a waiter by setting its future (`set_result(None)`), or fails it with a
    GatewayError."""

    def __init__(self, name: str, depth: int, timeout_s: float) -> None:
        self.name = name
        self.depth = depth
        self.timeout_s = timeout_s
        self.queued = 0
        self.hold_s = 5.0  # moving average of how long a slot is held, for Retry-After
        self._queue: FairQueue[_Waiter] = FairQueue()

    # -- estimates ----------------------------------------------------------------------------

    def note_hold(self, held_s: float | None) -> None:
        if held_s is not None:
            self.hold_s += 0.2 * (held_s - self.hold_s)

    def retry_after(self, slots: int, position: int | None = None) -> float:
        """Seconds until a request at `position` in the queue could expect a slot."""
        pos = self.queued + 1 if position is None else position
        return max(1.0, math.ceil(self.hold_s * pos / max(slots, 1)))

    def expected_wait_s(self, slots: int, in_use: int) -> float:
        """How long a request arriving now would wait for a slot: 0 with one free, else the
        queue ahead of it drained at the recent slot hold time (a guess, for routing)."""
        if self.queued == 0 and in_use < slots:
            return 0.0
        return self.hold_s * (self.queued + 1) / max(slots, 1)

    # -- the waiting ----------------------------------------------------------------------------

    def check_room(self, slots: int, where: str = "") -> None:
        """Refuse a new waiter when the queue is full."""
        if self.queued >= self.depth:
            raise GatewayError(
                "overloaded",
                f"backend {self.name!r} is busy: all {slots} slots in use{where} and "
                f"{self.queued} requests already waiting (queue depth {self.depth})",
                retry_after=self.retry_after(slots),
            )

    def waited_too_long(self, slots: int) -> GatewayError:
        return GatewayError(
            "overloaded",
            f"backend {self.name!r} is busy: no slot came free within {self.timeout_s:g} s in the queue",
            retry_after=self.retry_after(slots),
        )

    async def wait(self, waiter: _Waiter, slots: int, give_back: Callable[[], None]) -> None:
        """Queue `waiter` and wait for the store to grant it, within the queue timeout. A waiter
        granted in the same tick its caller left gives the slot back (`give_back`)."""
        self.push(waiter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.fut
        except TimeoutError:
            if granted(waiter.fut):
                return  # granted in the same tick the deadline passed: keep it
            self.remove(waiter)
            raise self.waited_too_long(slots) from None
        except BaseException:  # the caller left, or the store failed the waiter (GatewayError)
            if granted(waiter.fut):
                give_back()
            else:
                self.remove(waiter)
            raise

    # -- the order (fair_queue.py) --------------------------------------------------------------

    def push(self, w: _Waiter) -> None:
        self._queue.push(w)
        self.queued += 1

    def remove(self, w: _Waiter) -> None:
        if self._queue.remove(w):
            self.queued -= 1

    def pop(self) -> _Waiter | None:
        w = self._queue.pop()
        if w is not None:
            self.queued -= 1
        return w

    def peek(self) -> _Waiter | None:
        return self._queue.peek()

    def fail_all(self, err: GatewayError) -> None:
        while (w := self.pop()) is not None:
            if not w.fut.done():
                w.fut.set_exception(err)


class QueueFront:
    """What a slot store tells through the WaitQueue it owns (`queue`, with its `slots` and
    `in_use`): the queue's size and timeout, how many wait, Retry-After, the expected wait, the
    refusal of one that waited too long. Both stores, so the two cannot tell it differently."""

    queue: WaitQueue
    slots: int
    in_use: int

    @property
    def depth(self) -> int:
        return self.queue.depth

    @property
    def timeout_s(self) -> float:
        return self.queue.timeout_s

    @property
    def queued(self) -> int:
        return self.queue.queued

    def retry_after(self, position: int | None = None) -> float:
        return self.queue.retry_after(self.slots, position)

    def expected_wait_s(self) -> float:
        return self.queue.expected_wait_s(self.slots, self.in_use)

    def waited_too_long(self) -> GatewayError:
        """The refusal of a request that waited its queue timeout (a gate in front, such as a
        managed backend's, lifecycle/gate.py, keeps its own clock and refuses with it)."""
        return self.queue.waited_too_long(self.slots)


class SlotPool(QueueFront):
    """A backend's slots counted in process, with the shared WaitQueue in front."""

    def __init__(self, name: str, slots: int, depth: int, timeout_s: float) -> None:
        self.name = name
        self.slots = slots
        self.in_use = 0
        self.queue = WaitQueue(name, depth, timeout_s)

    async def acquire(self, key: str = "", priority: int = 0) -> None:
        """Take a slot, waiting in the queue if need be. Raises GatewayError("overloaded")."""
        if self.queue.queued == 0 and self.in_use < self.slots:
            self.in_use += 1
            return
        self.queue.check_room(self.slots)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), key, priority)
        await self.queue.wait(waiter, self.slots, self.release)

    def release(self, held_s: float | None = None) -> None:
        self.queue.note_hold(held_s)
        self.in_use -= 1
        self._grant()

    def resize(self, slots: int, depth: int, timeout_s: float) -> None:
        """Apply a reloaded config: held slots stay held, new ones are granted at once."""
        self.slots, self.queue.depth, self.queue.timeout_s = slots, depth, timeout_s
        self._grant()

    def _grant(self) -> None:
        while self.queue.queued and self.in_use < self.slots:
            w = self.queue.pop()
            if w is None or w.fut.done():
                continue
            self.in_use += 1
            w.fut.set_result(None)
