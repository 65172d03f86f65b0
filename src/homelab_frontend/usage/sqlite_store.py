"""The ledger in one SQLite file (the default): hourly rows, written by one thread.

The event loop only appends a finished request to a queue (`put`: no I/O, no wake-up). The
writer thread owns the connection: every `flush_interval_s` it takes whatever has queued and
writes the lot as one transaction of upserts (per row, not per request).
In WAL mode with `synchronous=NORMAL` a committed transaction survives the process being killed,
so a crash loses at most the entries of the last interval. A query is queued behind the pending
entries and runs on the same thread, so it sees every request that finished before it was asked.

The file lives beside the Responses store's (`$XDG_STATE_HOME` or `~/.local/state`, then
`homelab-frontend/usage.sqlite3`), `usage.path` overrides; its directory is made (and checked
writable) at start, the file at the first write.
Rows older than `retention_days` are deleted, checked once an hour. Budgets read counts kept in
memory, summed from the file at start (so a restart keeps a key's day and month).

Failures never hide. A write that fails (SQLite's error, or the OS's: the folder removed, the disk
full) is logged, counted and kept as `failure` (health, metrics); the thread lives on and tries
again with the next batch. A query that fails gets that failure as a 503 naming the file. A writer
thread that dies anyway (a bug) fails every query waiting for it at once, says why at ERROR, and
is started again by the next entry or query.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from .. import config as cfgmod
from ..errors import GatewayError
from .budgets import DAY_WINDOW, MONTH_WINDOW, windows
from .record import Entry
from .rollup import DIMS, FLOAT_METRICS, INT_METRICS, METRICS, Dims, Rollup
from .windows import DAY, HOUR

log = logging.getLogger("homelab_frontend")

_COLUMNS = ", ".join([f"{d} {'INTEGER' if d == 'start' else 'TEXT'} NOT NULL" for d in DIMS]
                     + [f"{m} INTEGER NOT NULL DEFAULT 0" for m in INT_METRICS]
                     + [f"{m} REAL NOT NULL DEFAULT 0" for m in FLOAT_METRICS])
_SCHEMA = f"CREATE TABLE IF NOT EXISTS usage_hour ({_COLUMNS}, PRIMARY KEY ({', '.join(DIMS)})) WITHOUT ROWID"
_UPSERT = (f"INSERT INTO usage_hour ({', '.join(DIMS + METRICS)}) VALUES ({', '.join('?' * len(DIMS + METRICS))}) "
           f"ON CONFLICT ({', '.join(DIMS)}) DO UPDATE SET "
           + ", ".join(f"{m} = {m} + excluded.{m}" for m in METRICS))


def _columns(db: sqlite3.Connection) -> set[str]:
    return {row[1] for row in db.execute("PRAGMA table_info(usage_hour)")}


def _add_columns(db: sqlite3.Connection) -> None:
    """A file written before a figure existed (the relayed calls' units) gets its column, 0 for
    the rows it already has."""
    have = _columns(db)
    for m in METRICS:
        if m not in have:
            typ = "REAL" if m in FLOAT_METRICS else "INTEGER"
            db.execute(f"ALTER TABLE usage_hour ADD COLUMN {m} {typ} NOT NULL DEFAULT 0")


def default_path() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "homelab-frontend", "usage.sqlite3")


def read_rows(db: sqlite3.Connection, since: float | None, until: float | None,
              key: str | None, model: str | None) -> list[tuple[Dims, list[float]]]:
    where: list[str] = []
    args: list[float | str] = []
    if since is not None:
        where.append("start >= ?")
        args.append(int(since // HOUR) * HOUR)
    if until is not None:
        where.append("start < ?")
        args.append(until)
    if key is not None:
        where.append("key = ?")
        args.append(key)
    if model is not None:
        where.append("model = ?")
        args.append(model)
    try:
        have = _columns(db)
    except sqlite3.OperationalError:
        have = set(METRICS)
    # an older file read without a gateway (the CLI, read-only) lacks the newer figures: 0
    sql = f"SELECT {', '.join(DIMS + tuple(m if m in have or not have else '0' for m in METRICS))} FROM usage_hour"
    if where:
        sql += " WHERE " + " AND ".join(where)
    try:
        got = db.execute(sql, args).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return []
        raise
    n = len(DIMS)
    return [(tuple(r[:n]), list(r[n:])) for r in got]  # type: ignore[misc]


def read_only(path: str) -> sqlite3.Connection | None:
    """The file for reading without a gateway (the CLI), or None when it does not exist yet."""
    if not os.path.exists(path):
        return None
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


_STOP = object()


class SqliteStore:
    def __init__(self, cfg: cfgmod.Usage) -> None:
        self.path = cfg.path or default_path()
        self.retention_s = cfg.retention_days * DAY
        self.flush_s = cfg.flush_interval_s
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._db: sqlite3.Connection | None = None
        self._pruned_at = 0.0
        self.used: dict[tuple[str, str, int], int] = {}  # (key, window, its start) -> tokens
        self.written = 0  # requests committed (tests, diagnostics)
        self.write_errors = 0  # batches that could not be written (metrics)
        self.lost = 0  # requests in those batches, or queued when the writer died
        self.restarts = 0  # writer threads started again after one died
        self.failure: str | None = None  # the last failure, until a write succeeds again
        self._dead = False  # the writer thread died: the next entry or query starts another
        self._in_hand: list = []  # the writer's current round of queries (failed if it dies)
        self._entries_in_hand = 0

    # -- on the event loop ----------------------------------------------------------------

    def put(self, e: Entry, budgeted: bool = False) -> None:
        self._count(e.key, e.tokens, e.ts)
        if self._thread is None or self._dead:
            self._start_thread()
        self._q.put(e)

    def health(self) -> dict:
        """For /healthz and /metrics: whether the writer is alive, and its last failure."""
        alive = not self._dead
        return {"ok": alive and self.failure is None, "writer_alive": alive, "failure": self.failure,
                "write_errors": self.write_errors, "lost": self.lost, "restarts": self.restarts}

    def _count(self, key: str, tokens: int, ts: float) -> None:
        if not tokens:
            return
        day, month = windows(ts)
        for w in ((key, DAY_WINDOW, day), (key, MONTH_WINDOW, month)):
            self.used[w] = self.used.get(w, 0) + tokens

    async def used_tokens(self, key: str, now: float) -> tuple[int, int]:
        day, month = windows(now)
        return self.used.get((key, DAY_WINDOW, day), 0), self.used.get((key, MONTH_WINDOW, month), 0)

    async def start(self) -> None:
        """The day's and month's counts per key, from the file (when there is one). A directory
        the ledger cannot write to stops the start, with the reason, instead of every write
        failing later."""
        parent = Path(self.path).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise cfgmod.ConfigError([f"usage.path: cannot create {str(parent)!r}: {err.strerror}"]) from None
        if not os.access(parent, os.W_OK) or (os.path.exists(self.path) and not os.access(self.path, os.W_OK)):
            raise cfgmod.ConfigError([f"usage.path: {self.path!r} is not writable"])
        if not os.path.exists(self.path):
            return
        day, month = windows(time.time())

        def load(db: sqlite3.Connection) -> list[tuple[str, str, int, int]]:
            out = []
            for window, since in ((DAY_WINDOW, day), (MONTH_WINDOW, month)):
                for key, n in db.execute("SELECT key, SUM(input_tokens + output_tokens) FROM usage_hour "
                                         "WHERE start >= ? GROUP BY key", (since,)):
                    out.append((key, window, since, int(n or 0)))
            return out

        for key, window, since, n in await self._run(load):
            self.used[(key, window, since)] = self.used.get((key, window, since), 0) + n

    async def rows(self, since, until, key, model) -> list[tuple[Dims, list[float]]]:
        return await self._run(lambda db: read_rows(db, since, until, key, model))

    async def close(self) -> None:
        if self._thread is None:
            return
        self._q.put(_STOP)
        self._wake.set()
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    def _run(self, fn: Callable[[sqlite3.Connection], object]):
        if self._thread is None or self._dead:
            self._start_thread()
        fut: Future = Future()
        self._q.put((fn, fut))
        self._wake.set()
        return asyncio.wrap_future(fut)

    # -- on the writer thread -------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._dead:
            old = self._thread
            if old is not None:
                # the dying writer is still failing what it had queued: a new entry or query put
                # before it has finished would be drained (lost, or failed with the old error)
                old.join(timeout=5)
            self.restarts += 1
            log.warning("usage ledger: starting the writer thread again (it died: %s)", self.failure)
        self._dead = False
        self._thread = threading.Thread(target=self._main, name="hlf-usage-ledger", daemon=True)
        self._thread.start()

    def _unavailable(self, err: BaseException) -> GatewayError:
        return GatewayError("backend_down", f"the usage ledger at {self.path!r} cannot be read: "
                            f"{type(err).__name__}: {err}", status=503, retry_after=5)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            _add_columns(db)
            self._db = db
        return self._db

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as err:  # a bug: nobody may wait on a thread that is gone
            self.failure = f"the writer thread died: {type(err).__name__}: {err}"
            self._dead = True
            log.exception("usage ledger: the writer thread died; it starts again at the next request or query")
            self._fail_pending(err)
            if self._db is not None:
                try:
                    self._db.close()
                except sqlite3.Error:
                    pass
                self._db = None

    def _fail_pending(self, err: BaseException) -> None:
        """Everything queued for a writer that died: queries get the error, entries are counted lost."""
        unavailable = self._unavailable(err)
        in_hand, self._in_hand = self._in_hand, []
        self.lost += self._entries_in_hand
        self._entries_in_hand = 0
        for _fn, fut in in_hand:  # taken off the queue already, not yet answered
            if not fut.done() and (fut.running() or fut.set_running_or_notify_cancel()):
                fut.set_exception(unavailable)
        try:
            while True:
                item = self._q.get_nowait()
                if isinstance(item, Entry):
                    self.lost += 1
                elif item is not _STOP and item[1].set_running_or_notify_cancel():
                    item[1].set_exception(unavailable)
        except queue.Empty:
            pass

    def _serve(self) -> None:
        stop = False
        while not stop:
            # Woken by a query or the end, else once an interval: an entry never wakes the
            # thread (a wake-up per request would hand the GIL back and forth per request).
            self._wake.wait(self.flush_s)
            self._wake.clear()
            batch = Rollup()
            jobs: list = []
            self._in_hand = jobs
            n = 0
            try:
                while True:
                    item = self._q.get_nowait()
                    if item is _STOP:
                        stop = True
                    elif isinstance(item, Entry):
                        batch.add(item)
                        n += 1
                    else:
                        jobs.append(item)
            except queue.Empty:
                pass
            if n:
                self._entries_in_hand = n
                self._write(batch, n)
                self._entries_in_hand = 0
            for fn, fut in jobs:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self._conn()))
                    except (sqlite3.Error, OSError) as err:  # the file or its folder: said as such
                        fut.set_exception(self._unavailable(err))
                    except BaseException as err:  # handed to the awaiting coroutine
                        fut.set_exception(err)
        if self._db is not None:
            self._db.close()
            self._db = None

    def _write(self, batch: Rollup, n: int) -> None:
        try:
            db = self._conn()
            db.execute("BEGIN")
            db.executemany(_UPSERT, [(*dims, *vals) for dims, vals in batch.take().items()])
            now = time.time()
            if now - self._pruned_at > HOUR:
                self._pruned_at = now
                db.execute("DELETE FROM usage_hour WHERE start < ?", (now - self.retention_s,))
            db.execute("COMMIT")
            self.written += n
            self.failure = None
        except (sqlite3.Error, OSError) as err:  # OSError: its folder could not be made, say
            self.write_errors += 1
            self.lost += n
            self.failure = f"cannot write to {self.path}: {type(err).__name__}: {err}"
            log.error("usage ledger: cannot write %d requests to %s: %s", n, self.path, err)
            try:
                if self._db is not None:
                    self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
