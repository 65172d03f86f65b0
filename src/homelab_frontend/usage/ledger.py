"""The ledger the gateway feeds: one call per finished request (`record`, from
`Gateway.observe`), budgets checked at admission (`check`), and the queries behind
`/admin/usage`, `/llm/v1/usage`, the dashboard and `homelab-frontend usage`."""

from __future__ import annotations

import time
from typing import Protocol

from .. import config as cfgmod
from . import budgets
from .record import Entry, Record, entry_of
from .rollup import Dims, aggregate


class Store(Protocol):
    """Where the counts live: sqlite_store.SqliteStore (one gateway) or redis_store.RedisStore
    (replicas sharing a Redis). `put` is never awaited (the hot path); the rest are."""

    def put(self, e: Entry, budgeted: bool = False) -> None: ...

    async def used_tokens(self, key: str, now: float) -> tuple[int, int]: ...

    async def rows(self, since: float | None, until: float | None, key: str | None,
                   model: str | None) -> list[tuple[Dims, list[float]]]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def health(self) -> dict:
        """Its own account of itself for /healthz and /metrics: `ok`, and what else it knows."""
        ...


class Ledger:
    def __init__(self, cfg: cfgmod.Config, redis_client=None) -> None:
        self.store: Store
        if redis_client is not None:
            from .redis_store import RedisStore

            self.store = RedisStore(cfg.usage, redis_client)
        else:
            from .sqlite_store import SqliteStore

            self.store = SqliteStore(cfg.usage)
        self.limits: dict[str, cfgmod.Budget] = {}
        self.configure(cfg)

    def configure(self, cfg: cfgmod.Config) -> None:
        """A config (re)load: the budgets (the counts live on)."""
        self.limits = budgets.limits_of(cfg.auth)

    def record(self, t: Record) -> None:
        e = entry_of(t, time.time())
        if e is not None:
            self.store.put(e, e.key in self.limits)

    def budgeted(self, key: str) -> bool:
        return key in self.limits

    async def check(self, key: str) -> None:
        """Raise the 429 when `key` is past a budget (its requests that finished count)."""
        budget = self.limits.get(key)
        if budget is None:
            return
        now = time.time()
        day, month = await self.store.used_tokens(key, now)
        err = budgets.refusal(key, budget, day, month, now)
        if err is not None:
            raise err

    async def query(self, *, since: float | None = None, until: float | None = None, key: str | None = None,
                    model: str | None = None, by: str = "hour") -> list[dict]:
        return aggregate(await self.store.rows(since, until, key, model), by)

    async def budget_status(self, key: str | None = None) -> list[dict]:
        now = time.time()
        out = []
        for name, budget in sorted(self.limits.items()):
            if key is not None and name != key:
                continue
            day, month = await self.store.used_tokens(name, now)
            out.append(budgets.status(name, budget, day, month, now))
        return out

    def health(self) -> dict:
        """The store's own account of itself (the SQLite writer thread: alive, its last failure)."""
        return self.store.health()

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        await self.store.close()
