"""Slot pools shared by gateway replicas through Redis (the `cluster:` config section): the
registry, one per gateway process, and the theory of operation. Each backend's pool is a
`redis_slot_pool.RedisSlotPool`; the keys and the Lua scripts are in redis_scripts.py.

Theory of operation
-------------------
Per backend, one sorted set `hlf:slots:<backend>` holds the slots in use by every replica: one
member per held slot, `<replica>:<request id>`, scored by its expiry in milliseconds of the Redis
server's own clock (`TIME`), so the replicas' clocks never matter. Taking a slot is one Lua script
(drop expired leases, count, add if under the limit), so two replicas can never both take the last
slot. Giving one back is `ZREM` plus a `PUBLISH` on `hlf:free:<backend>`.

Leases. A replica renews what it holds every `lease_s / 3`. A replica that dies (`kill -9`, a
power cut) stops renewing, and its slots expire within `lease_s` for the others to take.

Late is not gone. Redis answers late for ordinary reasons: a busy host, a fork for a snapshot, an
AOF fsync that Redis itself lets stall writes for up to 2 s, a VM's pause. Such a Redis is waited
for: every call may take up to `gone_after(lease_s)` = half a lease (5 s at the default 10 s)
before Redis counts as gone, and a request's own wait for its slot is bounded by its queue
timeout as well. Half a lease, because:
- that is when waiting stops being worth it: a Redis silent that long has missed a renewal round
  of every replica (they renew every lease_s / 3), and if it stays silent the running requests
  are stopped within the other half anyway (below), so work admitted later would only be fenced;
- it is well inside the leases: a slot taken by a call that was answered late is a fresh lease
  from Redis's own clock, and a running request's lease, renewed about lease_s / 3 before the
  silence began at the most, still has a sixth of a lease to run when Redis is declared gone,
  more than the fencing margin below (a tenth, at most 0.5 s);
- it rides out the pauses above at any `lease_s` a homelab would pick (2 s and more from
  `lease_s: 4` on; 5 s at the default).
A refused or reset connection is different: Redis (or the way to it) is gone at once.

Losing Redis (gone, as above). A replica that cannot reach Redis cannot tell whether Redis is gone
for everybody (a restart) or only for itself (a partition, while the others go on handing out
slots). So:
- new requests are refused with the overload error (queued ones too): no slot can be taken
  without Redis, and waiting longer for one would only hide the outage;
- requests already holding a slot keep running while their leases are still valid by the
  replica's own monotonic clock, counted from when the last successful renewal was *sent* (Redis
  stamped it later, so its expiry is never earlier). A request whose lease would run out before
  Redis answers is stopped with an error a little before that moment: after it, another replica
  may legitimately have its slot, and the backend must never run more than `slots`. This check
  runs all the time, not only once Redis is declared gone: a renewal that is merely late is no
  renewal either;
- on reconnect the replica re-registers the leases of the requests still running.

Redis that comes back empty (restarted without persistence) has forgotten every lease; a brand-new
one never held any. Redis cannot tell the two apart, the replicas can: only a replica that holds
slots has leases to lose. The first script to run on an empty Redis writes an epoch key holding
the end of a grace during which no new slot is granted, but re-registrations are accepted:
- run by a replica that holds slots (it says so: the `holder` argument), the grace is `lease_s`:
  every replica that holds a slot either re-registers it or stops its request before its old
  lease ends, which is before the grace ends, so when new grants resume the set is complete;
- run by a replica that holds none, the grace is a short discovery window (`DISCOVERY_S`):
  replicas that do hold slots notice the restart at once (their pub/sub connection breaks, and
  the listener, once subscribed again, has the maintainer renew without waiting for its next
  round) and re-register within it; the first re-registration of a lost lease turns the window
  into the full grace, `lease_s` from the epoch's start. So a fresh cluster waits about one
  second, not `lease_s`, and a Redis that lost its leases still waits the whole grace.
  The remaining risk: a replica that holds slots and cannot reach the new Redis within the window
  (a partition at the same moment as the restart); when it comes back, its lease is taken back if
  there is room, else its request is stopped, as for any lease that expired.

Every Redis call is bounded by `gone_after` (a refused connection is retried once, on a fresh
connection, within that bound: a pooled one may predate a Redis restart); the admin view and
shutdown, which must not wait on Redis, use a short bound (`quick_bound`) and treat running out
of it as "no answer yet", not as Redis gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Coroutine
from urllib.parse import urlsplit

from .. import config as cfgmod
from ..errors import GatewayError
from .redis_scripts import ACQUIRE, EPOCH_KEY, FREE_PATTERN, RELEASE, RENEW, VIEW
from .redis_slot_pool import RedisSlotPool

if TYPE_CHECKING:  # redis is imported when a `cluster:` section asks for it (Registry)
    from redis.commands.core import AsyncScript

log = logging.getLogger("homelab_frontend.cluster")

RECONNECT_S = 0.25  # how often an unreachable Redis is tried again
# How long an empty Redis first waits for replicas that hold slots to re-register (docstring):
# a listener's retry and the maintainer's pause (RECONNECT_S each), the calls, with room to spare.
DISCOVERY_S = 1.0
RETRY_AFTER_S = 2.0  # what a client refused for an unreachable Redis is told
QUICK_MIN_S = 0.2  # the shortest bound of any Redis call


def gone_after(lease_s: float) -> float:
    """How long Redis may leave a call unanswered before it counts as gone (docstring: half a
    lease). Never below QUICK_MIN_S: a lease that short is a test's, not a pause's measure."""
    return max(QUICK_MIN_S, lease_s / 2)


def quick_bound(lease_s: float) -> float:
    """The bound of a call that must not wait on a slow Redis (the admin view, shutdown)."""
    return max(QUICK_MIN_S, min(1.0, lease_s / 4))


async def kept_cancel(awaitable: Any) -> Any:
    """Await a Redis call in a request's task without losing a cancellation of that task.

    redis-py awaits its socket work through `asyncio.wait_for`, which on Python 3.11 returns the
    result when the call completed by the time the cancellation is delivered, and the cancellation
    is gone (fixed in 3.12, where wait_for is built on `asyncio.timeout`). Measured here: of 300
    tasks cancelled while looping on PING, 299 went on. A request cancelled during its slot's
    Redis call (its client left, a newer completion superseded it) would then run on. The task's
    `cancelling()` count still says it was asked: raised again here."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await awaitable
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


def describe_url(url: str) -> str:
    """The Redis URL without credentials, for logs and the admin view."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path or ''}"


# -- the registry: one per gateway process ------------------------------------------------------


class Registry:
    """This process's link to the shared slot state: the Redis client, the pub/sub listener, lease
    renewal, reconnection, and stopping requests whose leases can no longer be vouched for. Its
    pools talk to Redis through its public calls (`take`, `give_back`, `renew`, `live`)."""

    def __init__(self, cfg: cfgmod.Cluster) -> None:
        try:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import RedisError
            from redis.exceptions import TimeoutError as RedisTimeoutError
        except ImportError:
            raise cfgmod.ConfigError([
                "cluster: needs the redis client library; install it with "
                "pip install 'homelab-frontend[redis]'"
            ]) from None
        self.cfg = cfg
        self.replica = cfg.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.lease_s = cfg.lease_s
        self.lease_ms = max(1, int(cfg.lease_s * 1000))
        self.gone_s = gone_after(cfg.lease_s)  # a call unanswered this long: Redis is gone
        self.op_timeout = quick_bound(cfg.lease_s)  # calls that must not wait on a slow Redis
        # stop a request this long before its lease could end, for the stop itself to land
        self.margin = min(0.5, cfg.lease_s / 10)
        self.where = describe_url(cfg.redis_url)
        self._errors = (RedisError, OSError, TimeoutError)
        self._timeouts = (RedisTimeoutError, TimeoutError)
        self.client = aioredis.from_url(
            cfg.redis_url,
            decode_responses=True,
            # The socket bounds are the backstop for every user of this client (the usage ledger,
            # the Responses store, the lifecycle cluster): a late answer is waited for until Redis
            # counts as gone, never cut at a fraction of that (module docstring).
            socket_timeout=self.gone_s,
            socket_connect_timeout=self.gone_s,
            # One immediate retry on a fresh connection when one breaks: a pooled connection may
            # predate a Redis restart. Not on a timeout: a Redis that has not answered for gone_s
            # is gone, and asking again would only double the wait. Every script is idempotent.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._acquire = self.client.register_script(ACQUIRE)
        self._release = self.client.register_script(RELEASE)
        self._renew = self.client.register_script(RENEW)
        self._view = self.client.register_script(VIEW)
        self.pools: dict[str, RedisSlotPool] = {}
        self.ok = False  # Redis answered the last call; new slots can be taken
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.grace_until: float | None = None  # loop time when a fresh epoch's grace ends
        self._tasks: set[asyncio.Task[None]] = set()
        self._maintainer: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._fencer: asyncio.Task[None] | None = None
        self._went_down = asyncio.Event()
        self._closed = False

    def pool(self, name: str, slots: int, depth: int, timeout_s: float) -> RedisSlotPool:
        pool = RedisSlotPool(name, slots, depth, timeout_s, self)
        self.pools[name] = pool
        return pool

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """First contact (bounded), then the background tasks. Starts even when Redis is down:
        the replica then refuses new work until Redis answers."""
        await self._reconnect()
        if not self.ok:
            log.warning("cluster: Redis at %s is unreachable (%s); new requests are refused until it is back",
                        self.where, self.last_error)
        else:
            log.info("cluster: replica %r sharing slots through Redis at %s (lease %g s)",
                     self.replica, self.where, self.lease_s)
        self._maintainer = self.spawn(self._maintain())
        self._listener = self.spawn(self._listen())
        self._fencer = self.spawn(self._fence_loop())

    async def close(self) -> None:
        """Shutdown: give back every slot still held (the requests are over by now) and close."""
        self._closed = True
        for task in (self._maintainer, self._listener, self._fencer):
            if task is not None:
                task.cancel()
        for pool in self.pools.values():
            pool.stop(GatewayError("overloaded", "the gateway is shutting down", status=503, retry_after=5))
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2 * self.op_timeout)
        for pool in self.pools.values():
            members = pool.members()
            if members:
                try:
                    await self.give_back(pool, members, self.op_timeout)
                except GatewayError:
                    pass  # unreachable: the leases expire within lease_s anyway
        closer = getattr(self.client, "aclose", None) or self.client.close
        try:
            await asyncio.wait_for(closer(), self.op_timeout)
        except (*self._errors, asyncio.TimeoutError):
            pass

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task owned by the registry, not by any request: a release scheduled from inside a
        cancelled request's cleanup still runs to the end."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- calls (each bounded; Redis gone marks it down and raises `unreachable()`) -------------

    async def call(self, script: AsyncScript, keys: list[str], args: list[Any], within: float | None = None) -> Any:
        """Run `script`, waiting for a late answer until Redis counts as gone (`gone_s`), or, with
        `within`, only that long: running out of the caller's own, shorter budget raises `late()`
        and says nothing about Redis. A refused or broken connection is Redis gone at once."""
        bound = self.gone_s if within is None else min(within, self.gone_s)
        try:
            async with asyncio.timeout(bound):
                return await kept_cancel(script(keys=keys, args=args))
        except self._timeouts as err:
            if bound < self.gone_s:
                raise self.late(bound) from None
            self._mark_down(err, f"no answer for {self.gone_s:g} s")
            raise self.unreachable() from None
        except self._errors as err:
            self._mark_down(err)
            raise self.unreachable() from None

    async def take(self, pool: "RedisSlotPool", member: str, within: float | None = None) -> tuple[bool, int]:
        """One try to add `member` to `pool`'s lease set -> (taken, slots in use)."""
        taken, n, grace = await self.call(
            self._acquire, [pool.key, EPOCH_KEY],
            [self.lease_ms, pool.slots, member, self.holds_any(), self.discovery_ms], within)
        self.note_grace(int(grace))
        return bool(taken), int(n)

    async def give_back(self, pool: "RedisSlotPool", members: list[str], within: float | None = None) -> None:
        await self.call(self._release, [pool.key], [pool.channel, *members], within)

    async def renew(self, pool: "RedisSlotPool", drops: list[str], members: list[str]
                    ) -> tuple[list[str], list[str], list[str]]:
        """Renew `members`, give back `drops` -> (lost, re-added, every live member)."""
        grace, lost, readded, live = await self.call(
            self._renew, [pool.key, EPOCH_KEY],
            [self.lease_ms, pool.slots, pool.channel, self.holds_any(), self.discovery_ms,
             len(drops), *drops, *members])
        self.note_grace(int(grace))
        return list(lost), list(readded), list(live)

    async def live(self, pool: "RedisSlotPool") -> tuple[float, list[str], list[float]]:
        """Redis's clock now (ms), and the live leases of `pool` with their expiries (ms)."""
        now, flat = await self.call(self._view, [pool.key], [], self.op_timeout)
        return float(now), list(flat[::2]), [float(x) for x in flat[1::2]]

    def unreachable(self) -> GatewayError:
        return GatewayError(
            "overloaded",
            "the gateway cannot reach its cluster's slot registry (Redis) to take a slot for this "
            "request; try again shortly",
            retry_after=RETRY_AFTER_S,
        )

    def late(self, waited: float) -> GatewayError:
        return GatewayError(
            "overloaded",
            f"the gateway's cluster slot registry (Redis) did not answer within {waited:g} s, as long "
            "as this request may wait for a slot; try again shortly",
            retry_after=RETRY_AFTER_S,
        )

    def _mark_down(self, err: BaseException, what: str | None = None) -> None:
        self.last_error = what or (f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
        if self.ok:
            log.warning("cluster: lost Redis at %s (%s): refusing new requests, running ones keep their "
                        "slots for up to %g s", self.where, self.last_error, self.lease_s)
        self.ok = False
        self._went_down.set()
        if self.down_since is None:
            self.down_since = asyncio.get_running_loop().time()
        for pool in self.pools.values():
            pool.fail_waiters(self.unreachable())

    def note_grace(self, grace_ms: int) -> None:
        loop = asyncio.get_running_loop()
        if grace_ms > 0:
            if self.grace_until is None or self.grace_until < loop.time():
                log.warning("cluster: Redis holds no lease records (new or restarted empty): no new slot is "
                            "granted for %.1f s while replicas re-register the slots they hold", grace_ms / 1000)
            self.grace_until = loop.time() + grace_ms / 1000
        else:
            self.grace_until = None

    def holds_any(self) -> int:
        """1 when this replica holds slots (leases it would lose), for the epoch scripts."""
        return int(any(p.holds_any() for p in self.pools.values()))

    @property
    def discovery_ms(self) -> int:
        return min(self.lease_ms, int(DISCOVERY_S * 1000))

    # -- background ---------------------------------------------------------------------------

    async def _maintain(self) -> None:
        """Renew every lease_s / 3 while Redis answers; once it does not, try again every
        RECONNECT_S. Only a full successful round (`_reconnect`) lets new work in again."""
        while True:
            if self.ok:
                self._went_down.clear()
                try:
                    async with asyncio.timeout(self.lease_s / 3):
                        await self._went_down.wait()
                except TimeoutError:
                    await self._renew_all()
                    continue
            await asyncio.sleep(RECONNECT_S)
            await self._reconnect()

    async def _renew_all(self) -> bool:
        for pool in list(self.pools.values()):
            try:
                await pool.renew()
            except GatewayError:
                return False
        return True

    async def _reconnect(self) -> None:
        down_since = self.down_since
        was_down = down_since is not None
        if was_down:  # idle pooled connections may predate a Redis restart: start afresh
            try:
                await asyncio.wait_for(self.client.connection_pool.disconnect(), self.op_timeout)
            except (*self._errors, asyncio.TimeoutError):
                pass
        if await self._renew_all():  # the first call re-registers whatever is still running
            self.ok = True
            if down_since is not None:
                held = sum(len(p.leases()) for p in self.pools.values())
                log.warning("cluster: Redis at %s is back after %.1f s; %d held slots re-registered",
                            self.where, asyncio.get_running_loop().time() - down_since, held)
            self.down_since = None
            self.last_error = None

    async def _listen(self) -> None:
        """Wake the local granters when a slot is given back anywhere. Best effort: the granters
        also poll, so a lost message or a dead subscription only costs latency."""
        broken = False
        while True:
            pubsub = self.client.pubsub()
            try:
                async with asyncio.timeout(self.op_timeout):
                    await pubsub.psubscribe(FREE_PATTERN)
                if broken:
                    # Redis may have restarted empty: re-register what is held now, within the
                    # epoch's discovery window, rather than at the next renewal round
                    broken = False
                    self._went_down.set()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg and msg.get("type") == "pmessage":
                        pool = self.pools.get(str(msg["channel"])[len(FREE_PATTERN) - 1:])
                        if pool is not None:
                            try:
                                pool.freed(int(msg["data"]))
                            except (TypeError, ValueError):
                                pool.freed(None)
            except Exception as err:  # noqa: BLE001 - best effort, and it must not die
                broken = True
                if not isinstance(err, self._errors):
                    log.warning("cluster: pub/sub listener: %r; polling meanwhile", err)
                await asyncio.sleep(RECONNECT_S)
            finally:
                closer = getattr(pubsub, "aclose", None) or pubsub.reset
                try:
                    await asyncio.wait_for(closer(), self.op_timeout)
                except (*self._errors, asyncio.TimeoutError):
                    pass

    async def _fence_loop(self) -> None:
        """Stop each request just before its lease could expire unrenewed. Always on: a renewal
        Redis has not answered yet (late, or gone) is no renewal. While Redis answers, every
        lease is renewed every lease_s / 3, so no deadline is ever near and this only looks."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            now = loop.time()
            soonest = now + 1.0
            for pool in list(self.pools.values()):
                for lease in pool.leases():
                    if not lease.bound or lease.fenced:
                        continue
                    deadline = lease.valid_from + self.lease_s - self.margin
                    if now >= deadline:
                        pool.fence(lease, "Redis did not answer for longer than the slot lease "
                                          f"(cluster.lease_s = {self.lease_s:g} s)")
                    else:
                        soonest = min(soonest, deadline)
            await asyncio.sleep(max(0.01, min(soonest - now, RECONNECT_S)))

    # -- the admin view -----------------------------------------------------------------------

    async def view(self) -> dict[str, Any]:
        """Cluster-wide slot use, read from Redis now: per backend, who holds what. While Redis is
        unreachable: what was last seen, without waiting on Redis (`leases` is then null)."""
        backends: dict[str, dict[str, Any]] = {}
        for name, pool in list(self.pools.items()):
            leases = None
            if self.ok:
                try:
                    now, members, expiries = await self.live(pool)
                except GatewayError:
                    pass
                else:
                    leases = []
                    for member, score in zip(members, expiries):
                        replica, _, request = member.rpartition(":")
                        leases.append({"replica": replica, "request": request,
                                       "expires_in_s": round((score - now) / 1000, 3)})
                    pool.seen(members)
            backends[name] = {"slots": pool.slots, "in_use": pool.in_use, "held_here": pool.held,
                              "replicas": {r: n for r, n in sorted(pool.holders.items()) if n},
                              "leases": leases}
        loop = asyncio.get_running_loop()
        return {
            "replica": self.replica,  # no Redis address: internal addresses stay internal
            "reachable": self.ok,
            "down_for_s": None if self.down_since is None else round(loop.time() - self.down_since, 3),
            "last_error": self.last_error,
            "grace_s": self.grace_s(),  # a fresh epoch: no new slot is granted for this long
            "lease_s": self.lease_s,
            "backends": backends,
        }

    def grace_s(self) -> float | None:
        if self.grace_until is None:
            return None
        left = self.grace_until - asyncio.get_running_loop().time()
        return round(left, 3) if left > 0 else None
