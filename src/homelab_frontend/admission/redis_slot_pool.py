"""A backend's slots shared by gateway replicas through Redis: taking, giving back, renewing and
fencing its leases, and the granter that serves its queue. The registry (redis_registry.py) holds
the theory of operation: the lease set, renewal, when Redis counts as gone, the epoch and grace.

Waiting. Each replica keeps its own bounded fair queue (the one in `slots.SlotPool`) and one
granter task per backend that, while anybody waits, tries to take a slot for the head of the queue.
It retries when a slot is given back anywhere (pub/sub), and every POLL_S in any case, because
pub/sub delivers at most once and a lease that *expired* sends no message.

A take given up on (Redis gone, the request's queue timeout, its client leaving) may still run:
it was sent, and a paused Redis runs it when it resumes. Its member is given back at once all the
same, on another connection, and Redis serves its connections' input in the order it arrived, so
the release runs after the take and no lease is left behind (tests/unit/admission/
test_redis_slot_pool.py pauses Redis to check it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from typing import Any, Coroutine, Protocol

from ..errors import GatewayError
from .lease import Holder, Lease, SharedLease
from .redis_scripts import free_channel, leases_key, replica_of
from .slots import QueueFront, WaitQueue, _Waiter

log = logging.getLogger("homelab_frontend.cluster")


class PoolRegistry(Protocol):
    """What a pool asks of the registry that made it (redis_registry.Registry, which imports this
    module: declared here rather than imported back)."""

    replica: str
    op_timeout: float
    ok: bool

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...
    async def take(self, pool: RedisSlotPool, member: str, within: float | None = None) -> tuple[bool, int]: ...
    async def give_back(self, pool: RedisSlotPool, members: list[str], within: float | None = None) -> None: ...
    async def renew(self, pool: RedisSlotPool, drops: list[str], members: list[str]
                    ) -> tuple[list[str], list[str], list[str]]: ...
    def unreachable(self) -> GatewayError: ...

POLL_S = 0.25  # a waiting replica re-checks this often even without a pub/sub message


class RedisSlotPool(QueueFront):
    """A backend's slots as Redis leases. The queue in front (fairness, priority, depth, timeout,
    Retry-After, the gate of a managed backend) is the same `WaitQueue` the in-process `SlotPool`
    uses; what is this class's own is taking and giving back, which are awaits on Redis, and the
    granter task that serves the queue.

    Each held slot is a `Lease` whose `member` names it in Redis; the request's record rides on the
    lease (`holder`), so the fencing that must stop a request finds it there, whichever task took
    the slot.

    `in_use` is the cluster-wide count as last seen (every take, every renewal, and each admin
    view refresh it; a local release lowers it at once), so routing, the dashboard and the leak
    check see the backend's real load; `held` is this replica's share."""

    def __init__(self, name: str, slots: int, depth: int, timeout_s: float, registry: PoolRegistry) -> None:
        self.name = name
        self.slots = slots
        self.in_use = 0
        self.queue = WaitQueue(name, depth, timeout_s, slots)
        self.reg = registry
        self.key = leases_key(name)
        self.channel = free_channel(name)
        self.holders: Counter[str] = Counter()  # replica -> slots, as last seen
        self._held: dict[str, SharedLease] = {}  # member -> lease; what this replica renews
        self._dangling: set[str] = set()  # given back while Redis was unreachable: ZREM on reconnect
        self._wake = asyncio.Event()
        self._granter: asyncio.Task[None] | None = None
        self._seq = itertools.count()

    @property
    def held(self) -> int:
        return sum(1 for lease in self._held.values() if lease.bound)

    # -- what the registry asks ---------------------------------------------------------------

    def leases(self) -> list[SharedLease]:
        return list(self._held.values())

    def members(self) -> list[str]:
        """Every member this replica has in Redis or may still have (for the shutdown release)."""
        return [*self._held, *self._dangling]

    def holds_any(self) -> bool:
        return bool(self._dangling) or any(lease.bound for lease in self._held.values())

    def freed(self, in_use: int | None) -> None:
        """A slot was given back somewhere (pub/sub), leaving `in_use` taken cluster-wide."""
        self._wake.set()
        if in_use is not None:
            self.in_use = in_use

    def seen(self, live: list[str]) -> None:
        self.in_use = len(live)
        self.holders = Counter(replica_of(m) for m in live)

    def fail_waiters(self, err: GatewayError) -> None:
        self.queue.fail_all(err)

    def stop(self, err: GatewayError) -> None:
        if self._granter is not None:
            self._granter.cancel()
        self.fail_waiters(err)

    # -- admission ----------------------------------------------------------------------------

    async def acquire(self, key: str = "", priority: int = 0, holder: Holder | None = None) -> Lease:
        if not self.reg.ok:
            raise self.reg.unreachable()
        q = self.queue
        if q.queued == 0 and q.open():
            # a late Redis is waited for within this request's queue timeout (module docstring);
            # a timeout of 0 means "do not queue", not "do not ask Redis"
            lease = await self._take(holder, within=max(q.timeout_s, self.reg.op_timeout))
            if lease is not None:
                q.changed()
                return lease
        q.refuse_if_shut()
        q.check_room(self.slots, " across the cluster")
        waiter = _Waiter(asyncio.get_running_loop().create_future(), key, priority, holder)
        self._serve()
        return await q.wait(waiter, self.release)

    def release(self, lease: Lease, held_s: float | None = None) -> None:
        """Immediate for the caller: the slot leaves this replica's books now and the Redis call
        runs in a task of its own (if it fails, the lease is no longer renewed and expires)."""
        if lease.released:
            return
        lease.released = True
        self.queue.note_hold(held_s)
        if isinstance(lease, SharedLease) and self._held.get(lease.member) is lease:
            self._drop(lease.member)
            self.in_use = max(0, self.in_use - 1)
        self._wake.set()
        self.queue.changed()

    def grant(self) -> None:
        """The gate may have opened: serve the queue."""
        if self.queue.queued:
            self._serve()
        self._wake.set()

    def resize(self, slots: int, depth: int, timeout_s: float) -> None:
        self.slots, self.queue.depth, self.queue.timeout_s = slots, depth, timeout_s
        self.queue.slots = slots
        self._wake.set()

    # -- taking and giving back ---------------------------------------------------------------

    def _member(self, holder: Holder | None) -> str:
        # Never reused: a release's ZREM may still be on its way, and two holders of one member
        # would count as one slot. Request ids are new per request and a request is admitted once.
        if holder is None:
            return f"{self.reg.replica}:lease-{next(self._seq)}"
        member = f"{self.reg.replica}:{holder.id}"
        if member in self._held or member in self._dangling:
            member = f"{member}-{next(self._seq)}"
        return member

    async def _take(self, holder: Holder | None, waiter: _Waiter | None = None,
                    within: float | None = None) -> SharedLease | None:
        """One try in Redis -> the lease now held, or None when full (or the waiter left)."""
        member = self._member(holder)
        lease = self._held[member] = SharedLease(holder, member, asyncio.get_running_loop().time())
        try:
            taken, n = await self.reg.take(self, member, within)
        except BaseException:
            self._drop(member)  # the script may have run before the failure, or run yet: give it back
            raise
        self.in_use = n
        if not taken:
            self._held.pop(member, None)  # never added in Redis: nothing to give back
            return None
        if waiter is not None and waiter.fut.done():
            self._drop(member)  # it left while we were asking
            return None
        lease.bound = True
        self.holders[self.reg.replica] += 1
        return lease

    def _drop(self, member: str) -> None:
        """Off this replica's books now; out of Redis as soon as it answers."""
        lease = self._held.pop(member, None)
        if lease is None:
            return
        if lease.bound and self.holders[self.reg.replica] > 0:
            self.holders[self.reg.replica] -= 1
        if self.reg.ok:
            self.reg.spawn(self._give_back_remote(member))
        else:
            self._dangling.add(member)

    async def _give_back_remote(self, member: str) -> None:
        try:
            await self.reg.give_back(self, [member])
        except GatewayError:
            self._dangling.add(member)

    async def renew(self) -> None:
        """Renew what this replica holds, give back what it let go while Redis was away, and
        stop the requests whose leases were lost."""
        members = [m for m, lease in self._held.items() if lease.bound and not lease.fenced]
        drops = list(self._dangling)
        sent = asyncio.get_running_loop().time()
        lost, readded, live = await self.reg.renew(self, drops, members)
        self._dangling.difference_update(drops)
        lost_set = set(lost)
        for member in members:
            lease = self._held.get(member)
            if lease is not None and member not in lost_set:
                lease.valid_from = max(lease.valid_from, sent)
        for member in readded:
            if member not in self._held:  # given back while the renewal was on its way
                self.reg.spawn(self._give_back_remote(member))
        for member in lost:
            lease = self._held.get(member)
            if lease is not None:
                self.fence(lease, "its slot lease expired while Redis was unreachable and another "
                                  "replica has taken the slot since")
        self.seen(live)

    def fence(self, lease: SharedLease, why: str) -> None:
        """Stop the request holding `lease`: this replica can no longer vouch for its slot."""
        if lease.fenced or lease.released:
            return
        lease.fenced = True
        msg = f"the request was stopped because {why}; the backend never runs more than its slots"
        holder = lease.holder
        log.warning("cluster: backend %s: stopping request %s: %s", self.name,
                    holder.id if holder is not None else lease.member, why)
        if holder is None or not holder.cancel("slot_lost", msg):
            # nobody to stop (or it is ending already): the slot goes as soon as it is released
            log.debug("cluster: backend %s: lease %s had no running request to stop", self.name, lease.member)

    # -- the granter --------------------------------------------------------------------------

    def _serve(self) -> None:
        if self._granter is None or self._granter.done():
            # a task: it first runs once the caller's waiter is queued
            self._granter = self.reg.spawn(self._grant_loop())

    async def _grant_loop(self) -> None:
        try:
            await self._grant_rounds()
        except Exception:  # a bug must not leave the waiters to their queue timeout
            log.exception("cluster: backend %s: slot granter failed", self.name)
            self.fail_waiters(GatewayError("api_error", "internal error in the gateway's slot queue"))

    async def _grant_rounds(self) -> None:
        """While anybody waits here: take a slot in Redis for the head of the queue (once the
        gate admits), or wait for one to be given back somewhere (pub/sub), or POLL_S."""
        q = self.queue
        while q.queued:
            if not self.reg.ok:
                self.fail_waiters(self.reg.unreachable())
                return
            w = q.peek()
            if w is None:
                return
            self._wake.clear()  # before asking: a release during the call wakes the next round
            if q.open():
                try:
                    lease = await self._take(w.holder, waiter=w)
                except GatewayError:
                    return  # unreachable: the waiters were failed when it was marked down
                if lease is None and w.fut.done():
                    continue  # it left while we were asking: the next one
                if lease is not None:
                    if q.peek() is w:
                        q.pop()  # also rotates w's key behind the others
                    else:
                        q.remove(w)
                    w.fut.set_result(lease)
                    q.changed()
                    continue
            try:
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
