"""Admission control: a backend's sequence slots and the bounded queue in front of them.

A request holds one slot from admission until its last byte is written or its cancellation is
complete, so the backend never runs more sequences for us than its `slots`. When none is free the
request waits in a bounded queue, FIFO within an API key but round-robin between keys (one key's
burst cannot starve another) and by priority first (the order: fair_queue.py, pure). A full queue,
or a wait past the queue's timeout, is refused as `overloaded` with a Retry-After estimated from
recent slot hold times.

Two slot stores, one queue: `WaitQueue` is the part they share (the bounded fair queue, the
queue clock, what a waiter that leaves must undo, the hold-time estimate behind Retry-After and
routing's expected wait); each store owns one and decides only how a slot is taken and given back.
`SlotPool` keeps the count in process: the fast path (a free slot, nobody waiting, the backend
admitting) is a counter increment, and a release hands its slot to the next waiter synchronously.
`redis_slot_pool.RedisSlotPool` takes slots as Redis leases, an await, by a granter task of its own.
Both implement `SlotStore`: `acquire` returns a `Lease` (lease.py) and `release` takes it back.

A backend that does not always admit (a managed one, lifecycle/: stopped, loading, drained for a
swap) sets a `Gate` on its queue: while the gate is shut, nobody is admitted even with slots free,
waiters stay in this one queue, and the owner calls `grant()` when it opens. While the backend
loads (`set_loading(True)`), the queue clock of its waiters stands still: a cold start is not the
queue's fault (the start has its own timeout) and the time goes to each request's `load_wait`.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable, Protocol

from ..errors import GatewayError
from .fair_queue import FairQueue
from .lease import Holder, Lease


class Gate(Protocol):
    """What the owner of a backend that is not always admitting tells its queue (lifecycle/
    sets one per managed backend). Without a gate the backend always admits."""

    def admits(self) -> bool:
        """Admissible now (ready, not drained for a swap, first in line under `fifo`)."""
        ...

    def refusal(self) -> GatewayError | None:
        """An error to refuse a new request with at once (a failed start in its back-off)."""
        ...

    def changed(self) -> None:
        """A waiter arrived or left, or a slot was taken or given back: the owner may decide
        otherwise now (and counts the backend as used)."""
        ...

    def load_s(self) -> float:
        """How long until the backend admits, by its owner's estimate (a start's usual time)."""
        ...


class _Waiter:
    __slots__ = ("fut", "key", "priority", "holder", "arrived", "budget", "armed_at", "timer", "loading_since")

    def __init__(self, fut: asyncio.Future[Lease], key: str, priority: int, holder: Holder | None,
                 budget: float = 0.0) -> None:
        self.fut = fut
        self.key = key
        self.priority = priority
        self.holder = holder
        self.arrived = time.monotonic()
        self.budget = budget  # queue-clock seconds left
        self.armed_at: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.loading_since: float | None = None


def granted(fut: asyncio.Future[Lease]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


class WaitQueue:
    """The bounded fair queue in front of one backend's slots, for either slot store.

    It decides who is next (fair_queue.py) and how long one may wait; it never takes a slot:
    the store grants a waiter by setting its future to its `Lease`, or fails it with a
    GatewayError. Each waiter carries its own queue clock (a timer), paused while loading."""

    def __init__(self, name: str, depth: int, timeout_s: float, slots: int = 1) -> None:
        self.name = name
        self.depth = depth
        self.timeout_s = timeout_s
        self.slots = slots  # kept by the store (resize)
        self.queued = 0
        self.hold_s = 5.0  # moving average of how long a slot is held, for Retry-After
        self.gate: Gate | None = None
        self.loading = False
        self.load_wait_s = 0.0  # seconds waiters spent waiting for the backend to load (metrics)
        self._queue: FairQueue[_Waiter] = FairQueue()

    # -- the gate -------------------------------------------------------------------------------

    def open(self) -> bool:
        gate = self.gate
        return gate is None or gate.admits()

    def refuse_if_shut(self) -> None:
        if self.gate is not None:
            err = self.gate.refusal()
            if err is not None:
                raise err

    def changed(self) -> None:
        if self.gate is not None:
            self.gate.changed()

    def set_loading(self, loading: bool) -> None:
        """The backend started or stopped loading: pause or resume the waiters' queue clocks."""
        if loading is self.loading:
            return
        self.loading = loading
        for w in list(self._queue):
            self._clock(w)

    # -- estimates ----------------------------------------------------------------------------

    def note_hold(self, held_s: float | None) -> None:
        if held_s is not None:
            self.hold_s += 0.2 * (held_s - self.hold_s)

    def retry_after(self, slots: int | None = None, position: int | None = None) -> float:
        """Seconds until a request at `position` in the queue could expect a slot."""
        pos = self.queued + 1 if position is None else position
        return max(1.0, math.ceil(self.hold_s * pos / max(slots or self.slots, 1)))

    def expected_wait_s(self, slots: int, in_use: int) -> float:
        """How long a request arriving now would wait for a slot: 0 with one free and the
        backend admitting, else the queue ahead of it drained at the recent slot hold time, plus
        the backend's load time while it is not admitting (a guess, for routing)."""
        gate = self.gate
        shut = gate is not None and not gate.admits()
        if self.queued == 0 and in_use < slots and not shut:
            return 0.0
        wait = self.hold_s * (self.queued + 1) / max(slots, 1) if (self.queued or in_use >= slots) else 0.0
        return wait + (gate.load_s() if shut and gate is not None else 0.0)

    def oldest_wait(self) -> float | None:
        """When the longest-waiting request arrived (monotonic), or None."""
        return min((w.arrived for w in self._queue), default=None)

    # -- the waiting ----------------------------------------------------------------------------

    def check_room(self, slots: int | None = None, where: str = "") -> None:
        """Refuse a new waiter when the queue is full."""
        if self.queued >= self.depth:
            n = slots or self.slots
            raise GatewayError(
                "overloaded",
                f"backend {self.name!r} is busy: all {n} slots in use{where} and "
                f"{self.queued} requests already waiting (queue depth {self.depth})"
                if self.open() else
                f"backend {self.name!r} is busy: {self.queued} requests already waiting for it "
                f"(queue depth {self.depth})",
                retry_after=self.retry_after(n),
            )

    def waited_too_long(self, slots: int | None = None) -> GatewayError:
        return GatewayError(
            "overloaded",
            f"backend {self.name!r} is busy: no slot came free within {self.timeout_s:g} s in the queue",
            retry_after=self.retry_after(slots),
        )

    async def wait(self, waiter: _Waiter, give_back: Callable[[Lease], None]) -> Lease:
        """Queue `waiter` and wait for the store to grant it its lease, within the queue clock. A
        waiter granted in the same tick its caller left gives the slot back (`give_back`)."""
        waiter.budget = self.timeout_s
        self.push(waiter)
        self.changed()
        try:
            return await waiter.fut
        except BaseException:  # the caller left, the clock ran out, or the store failed the waiter
            if granted(waiter.fut):
                give_back(waiter.fut.result())
            elif self.remove(waiter):
                self.changed()  # one demand fewer: the owner may decide otherwise now
            raise

    # -- the queue clock ------------------------------------------------------------------------

    def _clock(self, w: _Waiter) -> None:
        now = time.monotonic()
        if self.loading:
            if w.holder is not None:
                w.holder.loading()
            self._disarm(w, now)
            if w.loading_since is None:
                w.loading_since = now
            return
        if w.holder is not None:
            w.holder.queued()
        self._end_loading(w, now)
        if w.timer is None:
            w.armed_at = now
            w.timer = asyncio.get_running_loop().call_later(max(w.budget, 0.0), self._expire, w)

    def _disarm(self, w: _Waiter, now: float) -> None:
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
            w.budget -= now - (w.armed_at or now)

    def _end_loading(self, w: _Waiter, now: float) -> None:
        if w.loading_since is not None:
            took = now - w.loading_since
            self.load_wait_s += took
            if w.holder is not None:
                w.holder.load_wait += took
            w.loading_since = None

    def _settle(self, w: _Waiter) -> None:
        """`w` left the queue (granted, failed, gone): its clock stops. Its phase stays as it
        was: a request that leaves while loading is counted `cancelled_loading`."""
        now = time.monotonic()
        self._disarm(w, now)
        self._end_loading(w, now)

    def _expire(self, w: _Waiter) -> None:
        w.timer = None
        if self.remove(w) and not w.fut.done():
            w.fut.set_exception(self.waited_too_long())
            self.changed()

    # -- the order (fair_queue.py) --------------------------------------------------------------

    def push(self, w: _Waiter) -> None:
        self._queue.push(w)
        self.queued += 1
        self._clock(w)

    def remove(self, w: _Waiter) -> bool:
        if self._queue.remove(w):
            self.queued -= 1
            self._settle(w)
            return True
        return False

    def pop(self) -> _Waiter | None:
        w = self._queue.pop()
        if w is not None:
            self.queued -= 1
            self._settle(w)
            if w.holder is not None:
                w.holder.queued()  # its turn: no longer waiting for a load
        return w

    def peek(self) -> _Waiter | None:
        return self._queue.peek()

    def fail_all(self, err: GatewayError) -> None:
        while (w := self.pop()) is not None:
            if not w.fut.done():
                w.fut.set_exception(err)


class SlotStore(Protocol):
    """A backend's slots, whichever store keeps them (`SlotPool`, `redis_slot_pool.RedisSlotPool`).
    `acquire` admits through the store's `WaitQueue` and returns the lease; `release` takes that
    lease back (once); `grant` serves the queue after its gate opened."""

    name: str
    slots: int
    in_use: int
    queue: WaitQueue

    async def acquire(self, key: str = "", priority: int = 0, holder: Holder | None = None) -> Lease: ...

    def release(self, lease: Lease, held_s: float | None = None) -> None: ...

    def resize(self, slots: int, depth: int, timeout_s: float) -> None: ...

    def grant(self) -> None: ...


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
        return self.queue.waited_too_long(self.slots)


class SlotPool(QueueFront):
    """A backend's slots counted in process, with the shared WaitQueue in front."""

    def __init__(self, name: str, slots: int, depth: int, timeout_s: float) -> None:
        self.name = name
        self.slots = slots
        self.in_use = 0
        self.queue = WaitQueue(name, depth, timeout_s, slots)

    async def acquire(self, key: str = "", priority: int = 0, holder: Holder | None = None) -> Lease:
        """Take a slot, waiting in the queue if need be. Raises GatewayError("overloaded")."""
        q = self.queue
        if q.queued == 0 and self.in_use < self.slots and (q.gate is None or q.gate.admits()):
            self.in_use += 1
            if q.gate is not None:
                q.gate.changed()
            return Lease(holder)
        q.refuse_if_shut()
        q.check_room(self.slots)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), key, priority, holder)
        return await q.wait(waiter, self.release)

    def release(self, lease: Lease, held_s: float | None = None) -> None:
        if lease.released:
            return
        lease.released = True
        q = self.queue
        if held_s is not None:
            q.hold_s += 0.2 * (held_s - q.hold_s)  # q.note_hold, inline: the hot path
        self.in_use -= 1
        if q.queued:
            self._grant()
        if q.gate is not None:
            q.gate.changed()

    def grant(self) -> None:
        self._grant()

    def resize(self, slots: int, depth: int, timeout_s: float) -> None:
        """Apply a reloaded config: held slots stay held, new ones are granted at once."""
        self.slots, self.queue.depth, self.queue.timeout_s = slots, depth, timeout_s
        self.queue.slots = slots
        self._grant()

    def _grant(self) -> None:
        q = self.queue
        while q.queued and self.in_use < self.slots and q.open():
            w = q.pop()
            if w is None or w.fut.done():
                continue
            self.in_use += 1
            w.fut.set_result(Lease(w.holder))
