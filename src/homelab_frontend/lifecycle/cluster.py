"""Managed backends across replicas (`cluster:`): one replica, the leader, runs them all.

Theory of operation. Replicas share one lock in Redis, `hlf:lc:leader`, a key holding the
leader's replica id with a lease (`cluster.lease_s`), taken with SET NX PX and renewed every
lease_s / 3 while the leader lives. One lock for the whole fleet rather than one per backend:
`resources` is one budget, and only a single decider can keep the backends' sum within it.
- The leader runs the policy and the processes as a lone gateway does. Every POLL_S it
  publishes every unit's state (`hlf:lc:states`, JSON, expiring after one lease) and reads
  what the others wait for (`hlf:lc:want`, one hash field per replica and backend: how many of
  its requests wait and for how long), which counts in its decisions like its own queue.
- A follower starts nothing. Its units mirror the leader's published states (void while no
  replica holds the lease): its queue admits
  when the backend is ready there (its requests go to the backend's URL like any), shows
  `loading` while it starts, answers the leader's failure while it is failed; and it publishes
  what waits in its queues.
- Takeover: a leader that dies stops renewing (its servers die with it: each one's supervisor,
  lifecycle/supervisor.py, kills its tree when the leader's pipe closes); the lease runs out
  and another replica takes the lock and starts from every backend stopped. A
  leader that cannot renew (Redis gone, a partition) stops its servers as soon as its lease may
  have run out, so that a new leader never runs a second copy beside them for long.
- Late is not gone (admission/redis_registry.py). A Redis call waits for a late answer up to the
  client's bound (half a lease), except that a leader's round never runs past the moment it must
  give up its lease (`GIVE_UP`, counted from its last renewal's sending): that is the fencing, and
  it does not wait for a call to fail. A `SET NX` the replica gave up on may still land: the
  lock then names this replica, and it claims it (renewing it first, so it knows from when the
  lease runs) instead of leaving the backends without a leader for a lease.
Limits: a follower's slot on a backend is counted by the shared slot pool (`in_use` there is
the cluster-wide count as last seen), so the leader may see a follower's brand-new request up to
POLL_S late when it decides to stop an idle backend; the follower's request then fails as a
backend that died would, and the next one starts it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Protocol

from .unit import Managed

log = logging.getLogger("homelab_frontend.lifecycle")

LEADER_KEY = "hlf:lc:leader"
STATES_KEY = "hlf:lc:states"
WANT_KEY = "hlf:lc:want"
POLL_S = 0.25
WANT_STALE_S = 2.0
LOG_EVERY_S = 30.0  # a Redis failure that goes on is said again this often
GIVE_UP = 0.8  # a leader unable to renew for this share of its lease stops its servers

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Led(Protocol):
    """What the coordinator drives: the fleet of this replica (fleet.Fleet)."""

    units: dict[str, Managed]

    def became_leader(self) -> None: ...
    def lost_leadership(self) -> None: ...
    def kick(self) -> None: ...
    def mirror(self, states: dict[str, Any]) -> None: ...


class Coordinator:
    def __init__(self, client: Any, replica: str, lease_s: float) -> None:
        self.client = client
        self.replica = replica
        self.lease_ms = max(1, int(lease_s * 1000))
        self.lease_s = lease_s
        self.leader = False
        self.leader_id: str | None = None
        self.remote_states: dict[str, Any] = {}  # the leader's published states (decoded JSON)
        self.remote_wants: dict[str, tuple[int, float | None]] = {}  # backend -> (waiting, oldest), monotonic
        self.remote_used: dict[str, float] = {}  # backend -> the last end of a request on another replica
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._renewed_at: float | None = None  # monotonic time the last successful renewal was sent
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failures = 0  # rounds failed in a row (Redis unreachable): logged, rate-limited
        self._failing_since: float | None = None
        self._logged_at: float | None = None

    def _failed(self, exc: BaseException) -> None:
        """A round failed: said at WARNING, then at most once per LOG_EVERY_S while it goes on."""
        now = time.monotonic()
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = now
        if self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            log.warning("lifecycle cluster: cannot reach Redis or read its answer (%s: %s)%s",
                        type(exc).__name__, exc,
                        f"; {self._failures} failed rounds in {now - self._failing_since:.0f} s"
                        if self._failures > 1 else "")
            self._logged_at = now

    def _recovered(self) -> None:
        if self._failing_since is not None:
            log.warning("lifecycle cluster: Redis answers again after %.1f s (%d failed rounds)",
                        time.monotonic() - self._failing_since, self._failures)
        self._failing_since = self._logged_at = None
        self._failures = 0

    def start(self, fleet: Led) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(fleet))

    async def _run(self, fleet: Led) -> None:
        next_renew = 0.0
        # not `while True`: a cancellation that lands as a Redis call completes is lost in redis-py
        # on Python 3.11 (admission/redis_registry.kept_cancel), and close() would wait for good
        while not self._closed:
            try:
                now = time.monotonic()
                if now >= next_renew:
                    async with asyncio.timeout_at(self._round_deadline()):
                        await self._lead(fleet)
                    next_renew = now + self.lease_s / 3
                async with asyncio.timeout_at(self._round_deadline()):
                    await self._exchange(fleet)
                self._recovered()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis unreachable, or an answer we did not expect
                self._failed(exc)
                if self.leader and (self._renewed_at is None
                                    or time.monotonic() - self._renewed_at >= self.lease_s * GIVE_UP):
                    self._lose(fleet, f"cannot renew the lease ({type(exc).__name__}: {exc})")
            await asyncio.sleep(POLL_S)

    def _round_deadline(self) -> float | None:
        """Loop time by which a round must end: a leader's when it must give up its lease (a late
        Redis is waited for until then, no longer); a follower's calls are bounded by the client."""
        if not self.leader or self._renewed_at is None:
            return None
        left = self._renewed_at + self.lease_s * GIVE_UP - time.monotonic()
        return asyncio.get_running_loop().time() + left

    async def _lead(self, fleet: Led) -> None:
        sent = time.monotonic()
        if self.leader:
            if await self._renew(keys=[LEADER_KEY], args=[self.replica, self.lease_ms]):
                self._renewed_at = sent
                return
            self._lose(fleet, "another replica holds the lease")
            return
        took = await self.client.set(LEADER_KEY, self.replica, nx=True, px=self.lease_ms)
        if not took:
            self.leader_id = await self.client.get(LEADER_KEY)
            if self.leader_id == self.replica:
                # our own SET of an earlier round, answered after we stopped waiting: it is ours,
                # from a moment we do not know; a renewal sent now dates it
                sent = time.monotonic()
                took = await self._renew(keys=[LEADER_KEY], args=[self.replica, self.lease_ms])
        if took:
            self.leader, self._renewed_at, self.leader_id = True, sent, self.replica
            log.warning("lifecycle: replica %r now runs the managed backends", self.replica)
            fleet.became_leader()

    def _lose(self, fleet: Led, why: str) -> None:
        self.leader = False
        log.warning("lifecycle: replica %r no longer runs the managed backends: %s", self.replica, why)
        fleet.lost_leadership()

    async def _exchange(self, fleet: Led) -> None:
        if self.leader:
            states = {name: {**u.as_dict(), "leader": self.replica} for name, u in fleet.units.items()}
            await self.client.set(STATES_KEY, json.dumps(states), px=self.lease_ms)
            raw = await self.client.hgetall(WANT_KEY)
            now_wall, now = time.time(), time.monotonic()
            wants: dict[str, tuple[int, float | None]] = {}
            for field, value in raw.items():
                replica, _, backend = field.partition("|")
                if replica == self.replica:
                    continue
                try:
                    doc = json.loads(value)
                    at, waiting = float(doc["at"]), int(doc["waiting"])
                    oldest_age, used_age = float(doc["oldest_age_s"]), float(doc["used_age_s"])
                except (ValueError, KeyError, TypeError):
                    continue
                late = max(0.0, now_wall - at)
                if late > WANT_STALE_S:
                    continue
                self.remote_used[backend] = max(self.remote_used.get(backend, 0.0), now - used_age - late)
                if waiting > 0:
                    n, o = wants.get(backend, (0, None))
                    oldest = now - oldest_age - late
                    wants[backend] = (n + waiting, oldest if o is None else min(o, oldest))
            if wants != self.remote_wants:
                self.remote_wants = wants
                fleet.kick()
            return
        leader, raw = await self.client.mget(LEADER_KEY, STATES_KEY)
        self.leader_id = leader
        # no lease, no leader: whatever it last published is void (its servers died with it)
        states = json.loads(raw) if (raw and leader) else {}
        if states != self.remote_states:
            self.remote_states = states
            fleet.mirror(states)
        now = time.monotonic()
        pipe = self.client.pipeline(transaction=False)
        for name, u in fleet.units.items():
            field = f"{self.replica}|{name}"
            pool = u.pool
            waiting = pool.queue.queued if pool is not None else 0
            oldest = (pool.queue.oldest_wait() if pool is not None else None) or now
            pipe.hset(WANT_KEY, field, json.dumps({"waiting": waiting, "oldest_age_s": now - oldest,
                                                   "used_age_s": now - u.last_used, "at": time.time()}))
        pipe.pexpire(WANT_KEY, int(WANT_STALE_S * 1000) * 5)
        await pipe.execute()

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            if self.leader:
                await self._release(keys=[LEADER_KEY], args=[self.replica])
        except Exception:  # Redis gone at shutdown: the lease runs out by itself
            pass
