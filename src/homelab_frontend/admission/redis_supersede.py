"""Latest wins across replicas: a client's new completion cancels its older one on any replica.

Imported only with a `cluster:` section (the gateway then uses `SharedSupersede` instead of
supersede.Supersede); it talks to the Redis the slot registry (redis_registry.py) already holds.

Design note
-----------
Behind a load balancer an editor's successive completions may land on different replicas, and
each replica only knows its own requests. What the replicas must agree on is which of a client's
completions on a model is the newest; then each replica cancels what it holds that is older.

- Order. Each registration asks Redis for a number, one Lua script per (client, model): the
  order is the order in which Redis ran the scripts, so the replicas' clocks never matter. The
  number is Redis's own clock in microseconds, raised to one past the key's last number when the
  clock has not moved on (`INCR` on a key with a TTL would do too, until the key expires or Redis
  restarts empty: a counter starting again at 1 would make the newest request look the oldest).
  The key is a digest of the pair, so client names never sit in Redis.
- Telling. The same script publishes `<number> <key digest> <token> <replica>` on one channel,
  to which every replica subscribes. A replica holding a request for that key with a smaller
  number cancels it through the request's own cancellation path (supersede.py), whatever its phase.
  The sender hears its own message too: a registration whose request ended while on its way to
  Redis is then still the newest, and cancels an older one on its own replica as well.
- Deciding locally (`Book`, pure). A replica keeps, per key, its newest request and its number.
  A new registration that got a *smaller* number than the one held here (two requests of one
  client on one replica racing to Redis) is the stale one and is cancelled itself: one order
  for everybody, so the highest number always survives and never two cancel each other. A
  number heard from elsewhere while a registration of the same key is on its way to Redis is
  remembered until it is back (the pub/sub message and the script's answer travel on different
  connections, in either order).
- Late is not gone (redis_registry.py). A registration waits for Redis's answer as long as any
  cluster call does (until Redis counts as gone, half a lease), not a fraction of it.
- Degrading. Without Redis (unreachable, or no answer until it counts as gone) a request gets no
  number and the rule is the one-process one: it cancels the older one held on this replica. It
  is said once in the log when that starts and once when Redis answers again, and a request is
  never refused for it. A request without a number is older than any number heard later, so
  after an outage the first numbered registration elsewhere cancels it.
- A registration given up on may still run: the script was sent, and a Redis that was only
  paused runs it when it resumes, publishing a number. Each registration carries a token; the
  number of one this replica gave up on cancels nothing here (the local order was applied when
  the request was placed without a number) and is adopted by its request if that is still the
  newest here (`Book.late`). Elsewhere it is a number like any, in Redis's order.
- Limits. Pub/sub delivers at most once: a message lost (a subscription being re-made) leaves
  the older completion running to its end, as before this module, never a wrong cancel. The
  numbers follow one Redis server's clock: a failover to a Redis whose clock is behind by more
  than a completion's life would, for completions registered on both sides of it, judge the
  newer one stale (for that one pair; the next completion is numbered on the new clock). The
  new request does not wait for an older one on another replica to end: it takes its slot
  through the shared pool, which hands it the slot the cancelled one gives back.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Hashable

from .redis_registry import kept_cancel
from .supersede import MESSAGE, Cancellable, wait_ended

log = logging.getLogger("homelab_frontend.cluster")

CHANNEL = "hlf:supersede"
KEY_PREFIX = "hlf:sup:"
KEY_TTL_MS = 3_600_000  # a key only breaks ties within one microsecond and clock steps back
RECONNECT_S = 0.25  # how often a broken subscription is made again
GIVEN_UP_KEPT = 1024  # registrations given up on, remembered until their number arrives (if ever)

# KEYS[1] the pair's key; ARGV: ttl ms, channel, "<digest> <token> <replica>" -> the number, as a string
# (Lua numbers are doubles: microseconds since 1970 stay exact below 2^53, until the year 2255)
REGISTER = """
local t = redis.call('TIME')
local seq = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if last >= seq then seq = last + 1 end
local s = string.format('%d', seq)
redis.call('SET', KEYS[1], s, 'PX', ARGV[1])
redis.call('PUBLISH', ARGV[2], s .. ' ' .. ARGV[3])
return s
"""


def key_of(client: str, model: str) -> str:
    return hashlib.sha256(f"{len(client)}:{client}{model}".encode()).hexdigest()[:32]


# -- the decision, pure -------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    handle: Cancellable
    seq: int | None  # None: registered without Redis


class Book:
    """One replica's view: per key its newest running request and that request's number, the
    registrations on their way to Redis, and the highest number heard while they are. Every
    call returns the handles to cancel; the caller cancels them."""

    __slots__ = ("_latest", "_pending", "_heard")

    def __init__(self) -> None:
        self._latest: dict[Hashable, _Entry] = {}
        self._pending: dict[Hashable, int] = {}
        self._heard: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._latest)

    def expect(self, key: Hashable) -> None:
        """A registration for `key` went to Redis; `place` or `abandon` follows."""
        self._pending[key] = self._pending.get(key, 0) + 1

    def abandon(self, key: Hashable) -> None:
        """The registration never came back (its request ended meanwhile)."""
        self._settle(key)

    def place(self, key: Hashable, handle: Cancellable, seq: int | None) -> list[Cancellable]:
        """The registration is back with its number (None without Redis). -> what is now stale:
        the older request held here, or `handle` itself when something newer is known."""
        heard = self._heard.get(key)
        self._settle(key)
        if seq is not None and heard is not None and heard > seq:
            return [handle]
        cur = self._latest.get(key)
        if cur is not None and seq is not None and cur.seq is not None and cur.seq > seq:
            return [handle]
        self._latest[key] = _Entry(handle, seq)
        if cur is None or cur.handle is handle:
            return []
        return [cur.handle]

    def heard(self, key: Hashable, seq: int) -> list[Cancellable]:
        """A replica (this one too) registered `key` with number `seq`. -> the request held here
        that it makes stale, if any."""
        if key in self._pending:
            self._heard[key] = max(seq, self._heard.get(key, seq))
        cur = self._latest.get(key)
        if cur is None or (cur.seq is not None and cur.seq >= seq):
            return []
        del self._latest[key]
        return [cur.handle]

    def late(self, key: Hashable, handle: Cancellable, seq: int) -> None:
        """`seq` is the number of `handle`'s own registration, which was placed without one
        (given up on) and ran in Redis after all: `handle` takes it if it is still the newest
        here. Nothing here is cancelled for it: this replica's order was applied at `place`."""
        cur = self._latest.get(key)
        if cur is not None and cur.handle is handle and cur.seq is None:
            cur.seq = seq

    def done(self, key: Hashable, handle: Cancellable) -> None:
        cur = self._latest.get(key)
        if cur is not None and cur.handle is handle:
            del self._latest[key]

    def _settle(self, key: Hashable) -> None:
        n = self._pending.get(key, 0) - 1
        if n > 0:
            self._pending[key] = n
        else:
            self._pending.pop(key, None)
            self._heard.pop(key, None)


# -- through Redis ------------------------------------------------------------------------------


class SharedSupersede:
    """The gateway's latest-wins table when replicas share a Redis: `latest` as in
    supersede.Supersede, ordered and told across replicas (module docstring). `registry` is the
    slot registry (redis_registry.Registry): its client, replica id, call bound and `ok`."""

    def __init__(self, registry: Any) -> None:
        self.reg = registry
        self.book = Book()
        self.superseded = 0  # requests cancelled here, for a newer one here or elsewhere
        self._register = registry.client.register_script(REGISTER)
        self._listener: asyncio.Task[None] | None = None
        self._local_only = False  # Redis failed us: said once, until it answers again
        self._closed = False
        self._tokens = itertools.count()
        self._given_up: dict[str, tuple[str, Cancellable]] = {}  # token -> (key, its request)

    def __len__(self) -> int:
        return len(self.book)

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe before the port opens (bounded: without Redis the listener keeps trying)."""
        subscribed = asyncio.Event()
        self._listener = self.reg.spawn(self._listen(subscribed))
        try:
            async with asyncio.timeout(self.reg.op_timeout):
                await subscribed.wait()
        except TimeoutError:
            pass

    async def close(self) -> None:
        self._closed = True  # the listener's cancellation may be lost in redis-py (kept_cancel)
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait((self._listener,), timeout=2 * self.reg.op_timeout)

    # -- a request ----------------------------------------------------------------------------

    @asynccontextmanager
    async def latest(self, client: str, model: str, handle: Cancellable) -> AsyncIterator[None]:
        """For the block: `handle` is its client's newest completion on `model` cluster-wide,
        until a newer one registers anywhere. An older one held here is cancelled and waited
        for (supersede.wait_ended); one held elsewhere is cancelled by its own replica."""
        key = key_of(client, model)
        self.book.expect(key)
        try:
            seq = await self._number(key, handle)
        except BaseException:
            self.book.abandon(key)
            raise
        for stale in self.book.place(key, handle, seq):
            if stale.cancel("superseded", MESSAGE):
                self.superseded += 1
                # itself: the cancellation lands at this await, before it asks for a slot
                await (asyncio.sleep(0) if stale is handle else wait_ended(stale))
        try:
            yield
        finally:
            self.book.done(key, handle)

    async def _number(self, key: str, handle: Cancellable) -> int | None:
        """The registration's number from Redis (published to the others), or None: local only.
        A late answer is waited for until Redis counts as gone (the registry's `gone_s`)."""
        if not self.reg.ok:
            self._degraded("the cluster's Redis is unreachable")
            return None
        token = str(next(self._tokens))
        try:
            async with asyncio.timeout(self.reg.gone_s):
                seq = int(await kept_cancel(self._register(
                    keys=[KEY_PREFIX + key],
                    args=[KEY_TTL_MS, CHANNEL, f"{key} {token} {self.reg.replica}"])))
        except Exception as err:  # noqa: BLE001 - whatever it is, the completion is still served
            self._given_up[token] = (key, handle)  # the script may run yet (module docstring)
            if len(self._given_up) > GIVEN_UP_KEPT:
                del self._given_up[next(iter(self._given_up))]
            self._degraded(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
            return None
        if self._local_only:
            self._local_only = False
            log.warning("supersede: Redis answers again; completions supersede across replicas again")
        return seq

    def _degraded(self, why: str) -> None:
        if not self._local_only:
            self._local_only = True
            log.warning("supersede: cannot register the completion in Redis (%s); until it answers, a "
                        "client's new completion supersedes only its older ones on this replica", why)

    # -- the others' registrations ------------------------------------------------------------

    def heard(self, data: str) -> None:
        """A message on CHANNEL: `<number> <key digest> <token> <replica>`."""
        try:
            seq_s, key, rest = data.split(" ", 2)
            seq = int(seq_s)
        except ValueError:
            return
        token, _, replica = rest.partition(" ")
        if replica == self.reg.replica and token in self._given_up:
            mine_key, handle = self._given_up.pop(token)
            if mine_key == key:
                self.book.late(key, handle, seq)
                return
        for stale in self.book.heard(key, seq):
            if stale.cancel("superseded", MESSAGE):
                self.superseded += 1
                log.info("supersede: request %s cancelled: its client's newer completion arrived on "
                         "replica %s", stale.id, replica)

    async def _listen(self, subscribed: asyncio.Event) -> None:
        """Best effort and never dies: a lost message only lets a stale completion run on."""
        while not self._closed:
            pubsub = self.reg.client.pubsub()
            try:
                async with asyncio.timeout(self.reg.op_timeout):
                    await pubsub.subscribe(CHANNEL)
                subscribed.set()
                while not self._closed:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg and msg.get("type") == "message":
                        self.heard(str(msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis gone or restarting: subscribe again
                await asyncio.sleep(RECONNECT_S)
            finally:
                closer = getattr(pubsub, "aclose", None) or pubsub.reset
                try:
                    await asyncio.wait_for(closer(), self.reg.op_timeout)
                except Exception:  # noqa: BLE001 - a broken connection closes as it can
                    pass
