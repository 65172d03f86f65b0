"""Admission for a managed backend: the queue in front of its slots while it loads or waits for room.

`ManagedPool` wraps the backend's ordinary slot pool (`admission.slots.SlotPool`, or the Redis
one) and is what `BackendState.pool` holds, so the exchange, routing and the admin views use it
unchanged. While the backend is ready and admitting, and nobody waits, a request goes straight
to the inner pool (the fast path costs one check). Otherwise it waits here, in the same fair
order (`admission.fair_queue`), and the fleet grants waiters as the policy admits them and
slots allow; the inner pool then only counts.

Two clocks, per waiter:
- the queue timeout (`queue.timeout_s`) runs while the request waits in phase `queued` (for a
  slot, or for another backend to make room) and is suspended while its own backend is
  starting (phase `loading`): a cold start is not the queue's fault, and `start_timeout_s`
  bounds it instead;
- a start that fails answers every waiter at once with that failure (`fail_all`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from ..admission.fair_queue import FairQueue
from ..errors import GatewayError

LOADING = "loading"  # request.tracker's phase for "waiting for its backend to start"
QUEUED = "queued"


class Record(Protocol):
    """The request's record (request.tracker.Tracked): its phase in /admin/requests, and how
    long it waited for its backend to load (the ledger's load wait, Ollama's load_duration)."""

    phase: str
    load_wait: float


class Host(Protocol):
    """What a gate asks of the fleet."""

    def admits(self, name: str) -> bool: ...

    def loading(self, name: str) -> bool: ...

    def refusal(self, name: str) -> GatewayError | None: ...

    def kick(self) -> None: ...

    def record_for(self, task: asyncio.Task | None) -> Record | None: ...

    def touched(self, name: str) -> None: ...

    def waited_loading(self, name: str, seconds: float) -> None: ...


class _Waiter:
    __slots__ = ("fut", "key", "priority", "record", "arrived", "budget", "armed_at", "timer", "loading_since")

    def __init__(self, fut: asyncio.Future, key: str, priority: int, record: Record | None, budget: float) -> None:
        self.fut = fut
        self.key = key
        self.priority = priority
        self.record = record
        self.arrived = time.monotonic()
        self.budget = budget  # queue-timeout seconds left
        self.armed_at: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.loading_since: float | None = None


class ManagedPool:
    def __init__(self, name: str, inner: Any, host: Host) -> None:
        self.name = name
        self.inner = inner
        self.host = host
        self._gate: FairQueue[_Waiter] = FairQueue()
        self._granting = 0  # granted, on their way into the inner pool

    # -- what routing and the admin views read (policy.routing.SlotPool) ----------------------

    @property
    def slots(self) -> int:
        return self.inner.slots

    @property
    def depth(self) -> int:
        return self.inner.depth

    @property
    def timeout_s(self) -> float:
        return self.inner.timeout_s

    @property
    def in_use(self) -> int:
        return self.inner.in_use

    @property
    def queued(self) -> int:
        return len(self._gate) + self.inner.queued

    def __getattr__(self, attr: str) -> Any:  # the Redis pool's extras (holders, held) for the views
        return getattr(self.inner, attr)

    def retry_after(self, position: int | None = None) -> float:
        return self.inner.retry_after(position)

    def expected_wait_s(self) -> float:
        return self.inner.expected_wait_s() + (0.0 if self.host.admits(self.name) else 5.0)

    def oldest_wait(self) -> float | None:
        return min((w.arrived for w in self._gate), default=None)

    def waiting(self) -> int:
        return len(self._gate)

    def busy(self) -> int:
        """Slots held, counting the waiters granted a moment ago and still on their way into the
        inner pool: the backend must not be stopped under them either."""
        return self.inner.in_use + self._granting

    # -- admission ----------------------------------------------------------------------------

    def _room(self) -> bool:
        return self.inner.in_use + self._granting < self.inner.slots

    async def acquire(self, key: str = "", priority: int = 0, holder: Any = None) -> Any:
        host = self.host
        if not self._gate and self._room() and host.admits(self.name):
            return await self._enter(key, priority, holder)
        err = host.refusal(self.name)
        if err is not None:
            raise err
        if len(self._gate) >= self.inner.depth:
            raise GatewayError(
                "overloaded",
                f"backend {self.name!r} is busy: {len(self._gate)} requests already waiting for it "
                f"(queue depth {self.inner.depth})",
                retry_after=self.retry_after(),
            )
        loop = asyncio.get_running_loop()
        w = _Waiter(loop.create_future(), key, priority, holder,
                    self.inner.timeout_s)
        self._gate.push(w)
        self._clock(w, host.loading(self.name))
        host.kick()
        try:
            await w.fut
        except BaseException:
            self._stop_clock(w)
            if self._gate.remove(w):
                host.kick()  # one demand fewer: the policy may decide otherwise now
            elif w.fut.done() and not w.fut.cancelled() and w.fut.exception() is None:
                self._granting -= 1  # granted in the same tick it left
                self.grant()
            raise
        try:
            return await asyncio.wait_for(self._enter(key, priority, holder), max(w.budget, 0.001))
        except TimeoutError:
            raise self.inner.waited_too_long() from None
        finally:
            self._granting -= 1

    async def _enter(self, key: str, priority: int, holder: Any) -> Any:
        lease = await self.inner.acquire(key, priority, holder)
        self.host.touched(self.name)
        return lease

    def release(self, lease: Any, held_s: float | None = None) -> None:
        self.inner.release(lease, held_s)
        self.host.touched(self.name)
        self.grant()
        self.host.kick()

    def resize(self, slots: int, depth: int, timeout_s: float) -> None:
        self.inner.resize(slots, depth, timeout_s)
        self.grant()

    # -- driven by the fleet ------------------------------------------------------------------

    def grant(self) -> None:
        """Let waiters in, in fair order, as the policy admits and slots allow."""
        while self._gate and self._room() and self.host.admits(self.name):
            w = self._gate.pop()
            if w is None:
                break
            if w.fut.done():
                continue
            self._stop_clock(w)
            if w.record is not None:
                w.record.phase = QUEUED
            self._granting += 1
            w.fut.set_result(None)

    def loading_changed(self) -> None:
        """The backend started or stopped loading: suspend or resume the waiters' queue clocks."""
        loading = self.host.loading(self.name)
        for w in self._gate:
            self._clock(w, loading)

    def fail_all(self, err: GatewayError) -> None:
        for w in list(self._gate):
            self._gate.remove(w)
            self._stop_clock(w)
            if not w.fut.done():
                w.fut.set_exception(err)

    def _clock(self, w: _Waiter, loading: bool) -> None:
        now = time.monotonic()
        if loading:
            if w.record is not None:
                w.record.phase = LOADING
            if w.timer is not None:
                w.timer.cancel()
                w.timer = None
                w.budget -= now - (w.armed_at or now)
            if w.loading_since is None:
                w.loading_since = now
            return
        if w.record is not None:
            w.record.phase = QUEUED
        self._end_loading(w, now)
        if w.timer is None:
            w.armed_at = now
            w.timer = asyncio.get_running_loop().call_later(max(w.budget, 0.0), self._expire, w)

    def _stop_clock(self, w: _Waiter) -> None:
        now = time.monotonic()
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
            w.budget -= now - (w.armed_at or now)
        self._end_loading(w, now)

    def _end_loading(self, w: _Waiter, now: float) -> None:
        if w.loading_since is not None:
            self.host.waited_loading(self.name, now - w.loading_since)
            if w.record is not None:
                w.record.load_wait += now - w.loading_since
            w.loading_since = None

    def _expire(self, w: _Waiter) -> None:
        w.timer = None
        if self._gate.remove(w) and not w.fut.done():
            self._end_loading(w, time.monotonic())
            w.fut.set_exception(self.inner.waited_too_long())
            self.host.kick()
