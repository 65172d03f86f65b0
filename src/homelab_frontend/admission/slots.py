"""Admission control: a backend's sequence slots and the bounded queue in front of them.

A request holds one slot from admission until its last byte is written or its cancellation is
complete, so the backend never runs more sequences for us than its `slots`. When none is free the
request waits in a bounded queue, FIFO within an API key but round-robin between keys (one key's
burst cannot starve another) and by key priority first (the order: fair_queue.py, pure). A full queue, or a wait past the queue's
timeout, is refused as `overloaded` with a Retry-After estimated from recent slot hold times.

The fast path (a free slot, nobody waiting) is a counter increment: queueing costs nothing until
it is needed. `SlotPool` keeps the count in process; `redis_leases.RedisSlotPool` shares it between
replicas: it reuses the queue here (`_enqueue`, `_pop_next`, `_forget`) and replaces `acquire` /
`release`, because taking a slot there is an await on Redis.
"""

from __future__ import annotations

import asyncio
import math
from ..errors import GatewayError
from .fair_queue import FairQueue


class _Waiter:
    __slots__ = ("fut", "key", "priority")

    def __init__(self, fut: asyncio.Future, key: str, priority: int) -> None:
        self.fut = fut
        self.key = key
        self.priority = priority


class SlotPool:
    def __init__(self, name: str, slots: int, depth: int, timeout_s: float) -> None:
        self.name = name
        self.slots = slots
        self.depth = depth
        self.timeout_s = timeout_s
        self.in_use = 0
        self.queued = 0
        self._queue: FairQueue[_Waiter] = FairQueue()
        self._hold_s = 5.0  # moving average of how long a slot is held, for Retry-After

    # -- what a replica-shared pool overrides ------------------------------------------------

    def _try_take(self) -> bool:
        if self.in_use < self.slots:
            self.in_use += 1
            return True
        return False

    def _give_back(self) -> None:
        self.in_use -= 1

    # -- admission ----------------------------------------------------------------------------

    def retry_after(self, position: int | None = None) -> float:
        """Seconds until a request at `position` in the queue could expect a slot."""
        pos = self.queued + 1 if position is None else position
        return max(1.0, math.ceil(self._hold_s * pos / max(self.slots, 1)))

    def expected_wait_s(self) -> float:
        """How long a request arriving now would wait for a slot: 0 with one free, else the
        queue ahead of it drained at the recent slot hold time (a guess, for routing)."""
        if self.queued == 0 and self.in_use < self.slots:
            return 0.0
        return self._hold_s * (self.queued + 1) / max(self.slots, 1)

    async def acquire(self, key: str = "", priority: int = 0) -> None:
        """Take a slot, waiting in the queue if need be. Raises GatewayError("overloaded")."""
        if self.queued == 0 and self._try_take():
            return
        if self.queued >= self.depth:
            raise GatewayError(
                "overloaded",
                f"backend {self.name!r} is busy: all {self.slots} slots in use and "
                f"{self.queued} requests already waiting (queue depth {self.depth})",
                retry_after=self.retry_after(),
            )
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), key, priority)
        self._enqueue(waiter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await waiter.fut
        except TimeoutError:
            if waiter.fut.done() and not waiter.fut.cancelled():
                return  # granted in the same tick the deadline passed: keep it
            self._forget(waiter)
            raise self.waited_too_long() from None
        except BaseException:
            if waiter.fut.done() and not waiter.fut.cancelled():
                self.release()  # granted, but the caller went away before using it
            else:
                self._forget(waiter)
            raise

    def waited_too_long(self) -> GatewayError:
        return GatewayError(
            "overloaded",
            f"backend {self.name!r} is busy: no slot came free within {self.timeout_s:g} s in the queue",
            retry_after=self.retry_after(),
        )

    def release(self, held_s: float | None = None) -> None:
        if held_s is not None:
            self._hold_s += 0.2 * (held_s - self._hold_s)
        self._give_back()
        self._grant()

    def resize(self, slots: int, depth: int, timeout_s: float) -> None:
        """Apply a reloaded config: held slots stay held, new ones are granted at once."""
        self.slots, self.depth, self.timeout_s = slots, depth, timeout_s
        self._grant()

    # -- the queue (admission/fair_queue.py decides who is next) ------------------------------

    def _enqueue(self, w: _Waiter) -> None:
        self._queue.push(w)
        self.queued += 1

    def _forget(self, w: _Waiter) -> None:
        if self._queue.remove(w):
            self.queued -= 1

    def _pop_next(self) -> _Waiter | None:
        w = self._queue.pop()
        if w is not None:
            self.queued -= 1
        return w

    def _grant(self) -> None:
        while self.queued and self._try_take():
            w = self._pop_next()
            if w is None or w.fut.done():
                self._give_back()
                continue
            w.fut.set_result(None)
