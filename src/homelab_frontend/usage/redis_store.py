"""The ledger in the cluster's Redis (with a `cluster:` section): one ledger for every replica.

Rows: one hash per UTC hour (`hlf:usage:h:<start>`), a field per figure and row
(`<figure>|<row dims as JSON>`), added to with HINCRBY / HINCRBYFLOAT, so replicas writing the
same row add up instead of overwriting; each hash expires after `retention_days`, and a sorted
set of the hours holding rows lets a query find them. Entries are gathered in memory and
written every `flush_interval_s` in one pipeline, so a replica that crashes loses at most that.

Budgets: one counter per key and window (`hlf:usage:b:<key>:d:<day start>`, `...:m:<month
start>`). A budgeted key's request is INCRBY'd the moment it finishes, not at the next flush, and
the counters are read (MGET) when that key's next request is admitted: another replica's finished
request counts at once. What this replica has sent but Redis has not yet acknowledged is added on
top, so it is never counted late. Keys without a budget are counted with the next flush (a budget
added by a reload then starts from the right figure). Redis unreachable at admission: a 503, not
a waived budget. A Redis that answers late is waited for, as by every user of the cluster's
client: its socket bound is the time after which Redis counts as gone (half a lease,
admission/redis_registry.py), so a pause of a second or two delays a budget check, never fails it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from .. import config as cfgmod
from ..errors import GatewayError
from .budgets import DAY_WINDOW, MONTH_WINDOW, windows
from .record import Entry
from .rollup import FLOAT_METRICS, METRICS, Dims, Rollup
from .windows import DAY, HOUR

log = logging.getLogger("homelab_frontend")
PREFIX = "hlf:usage:"
_INDEX = PREFIX + "hours"


def _budget_key(key: str, window: str, start: int) -> str:
    return f"{PREFIX}b:{key}:{window}:{start}"


def _windowed(later: dict[tuple[str, int], int]) -> dict[tuple[str, str, int], int]:
    """Unbudgeted keys' tokens (budgeted ones are counted at once) per budget counter."""
    out: dict[tuple[str, str, int], int] = {}
    for (key, ts), tokens in later.items():
        day, month = windows(ts)
        for w in ((key, DAY_WINDOW, day), (key, MONTH_WINDOW, month)):
            out[w] = out.get(w, 0) + tokens
    return out


class RedisStore:
    def __init__(self, cfg: cfgmod.Usage, client) -> None:
        self.client = client  # the cluster registry's (strings in, strings out)
        self.retention_s = cfg.retention_days * DAY
        self.flush_s = cfg.flush_interval_s
        self.pending = Rollup()
        self.unacked: dict[str, int] = {}  # budget counter -> tokens sent, not yet acknowledged
        self.later: dict[tuple[str, int], int] = {}  # (key, finished at) -> tokens, counted at the flush
        self._tasks: set[asyncio.Task] = set()
        self._flusher: asyncio.Task | None = None
        self._errors: tuple = (OSError, TimeoutError)
        try:
            from redis.exceptions import RedisError

            self._errors = (RedisError, OSError, TimeoutError)
        except ImportError:  # the registry would have refused to start
            pass
        self.written = 0

    def put(self, e: Entry, budgeted: bool = False) -> None:
        self.pending.add(e)
        if e.tokens and not budgeted:
            k = (e.key, int(e.ts))
            self.later[k] = self.later.get(k, 0) + e.tokens
        if e.tokens and budgeted:  # the others' counts go with the next flush
            day, month = windows(e.ts)
            names = (_budget_key(e.key, DAY_WINDOW, day), _budget_key(e.key, MONTH_WINDOW, month))
            for n in names:  # counted here at once, before Redis has it
                self.unacked[n] = self.unacked.get(n, 0) + e.tokens
            task = asyncio.get_running_loop().create_task(self._count(e.key, e.tokens, names, int(e.ts)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _count(self, key: str, tokens: int, names: tuple[str, str], ts: int) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.incrby(names[0], tokens)
            pipe.expire(names[0], 2 * DAY)
            pipe.incrby(names[1], tokens)
            pipe.expire(names[1], 32 * DAY)
            await pipe.execute()
        except self._errors as err:
            log.warning("usage ledger: cannot count %d tokens of key %r in Redis now (retried with the next "
                        "flush): %s", tokens, key, err)
            self.later[(key, ts)] = self.later.get((key, ts), 0) + tokens
        finally:
            for n in names:
                left = self.unacked[n] - tokens
                if left:
                    self.unacked[n] = left
                else:
                    del self.unacked[n]

    async def used_tokens(self, key: str, now: float) -> tuple[int, int]:
        day, month = windows(now)
        names = [_budget_key(key, DAY_WINDOW, day), _budget_key(key, MONTH_WINDOW, month)]
        try:
            got = await self.client.mget(names)
        except self._errors as err:
            # a budget that cannot be read is not waived: the replica refuses new work without
            # Redis anyway (its slots live there)
            raise GatewayError("overloaded", f"the key's budget cannot be checked: Redis is unreachable ({err})",
                               status=503, retry_after=2) from None
        return tuple(int(v or 0) + self.unacked.get(n, 0) for v, n in zip(got, names))  # type: ignore[return-value]

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.flush_s)
        await self.flush()

    async def flush(self) -> None:
        rows = self.pending.take()
        if not rows and not self.later:
            return
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        hours: set[int] = set()
        for dims, vals in rows.items():
            start = dims[0]
            hours.add(start)
            h = f"{PREFIX}h:{start}"
            tag = msgspec.json.encode(list(dims[1:])).decode()
            for name, v in zip(METRICS, vals):
                if not v:
                    continue
                if name in FLOAT_METRICS:
                    pipe.hincrbyfloat(h, f"{name}|{tag}", float(v))
                else:
                    pipe.hincrby(h, f"{name}|{tag}", int(v))
        later = self.later
        self.later = {}
        for (key, window, wstart), tokens in _windowed(later).items():
            name = _budget_key(key, window, wstart)
            pipe.incrby(name, tokens)
            pipe.expire(name, (2 if window == DAY_WINDOW else 32) * DAY)
        for start in hours:
            pipe.expireat(f"{PREFIX}h:{start}", int(start + HOUR + self.retention_s))
            pipe.zadd(_INDEX, {str(start): start})
        pipe.zremrangebyscore(_INDEX, "-inf", now - self.retention_s - HOUR)
        try:
            await pipe.execute()
            self.written += sum(int(v[0]) for v in rows.values())
        except self._errors as err:
            log.warning("usage ledger: cannot write %d rows to Redis (kept for the next try): %s", len(rows), err)
            for k, tokens in later.items():
                self.later[k] = self.later.get(k, 0) + tokens
            self.pending.put_back(rows)  # the next flush tries again

    async def rows(self, since, until, key, model) -> list[tuple[Dims, list[float]]]:
        await self.flush()  # what this replica knows, first
        lo = "-inf" if since is None else int(since // HOUR) * HOUR
        hi = "+inf" if until is None else f"({until}"
        hours = [int(h) for h in await self.client.zrangebyscore(_INDEX, lo, hi)]
        if not hours:
            return []
        pipe = self.client.pipeline(transaction=False)
        for start in hours:
            pipe.hgetall(f"{PREFIX}h:{start}")
        got = await pipe.execute()
        out: list[tuple[Dims, list[float]]] = []
        index = {name: i for i, name in enumerate(METRICS)}
        for start, fields in zip(hours, got):
            by_row: dict[str, list[float]] = {}
            for field, value in (fields or {}).items():
                name, _, tag = field.partition("|")
                if name not in index:
                    continue
                by_row.setdefault(tag, [0.0] * len(METRICS))[index[name]] += float(value)
            for tag, vals in by_row.items():
                rest = msgspec.json.decode(tag)
                dims = (start, *rest)
                if (key is not None and dims[1] != key) or (model is not None and dims[2] != model):
                    continue
                out.append((dims, vals))  # type: ignore[arg-type]
        return out

    async def start(self) -> None:
        pass

    def health(self) -> dict:
        """Nothing of its own to report: Redis's reachability is the cluster registry's."""
        return {"ok": True}

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        try:
            await self.flush()
        except self._errors:
            pass
