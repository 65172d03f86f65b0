"""The SQLite ledger (usage/sqlite_store.py) on a real file: rows upserted per hour, queries see
every entry put before them, retention, and the day's and month's counts summed back at start."""

from __future__ import annotations

import asyncio
import time

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.usage import Ledger
from homelab_frontend.usage.record import Entry
from homelab_frontend.usage.sqlite_store import SqliteStore


def _entry(ts: float, key: str = "alice", model: str = "m", tin: int = 10, tout: int = 5, outcome: str = "ok") -> Entry:
    return Entry(ts=ts, key=key, model=model, upstream="up", backend="b", dialect="openai", outcome=outcome,
                 input_tokens=tin, cached_tokens=2, output_tokens=tout, input_exact=True, output_exact=True,
                 slot_seconds=1.5, queue_seconds=0.25, load_seconds=0.0)


def test_entries_become_hourly_rows_and_a_query_sees_them_at_once(tmp_path):
    async def main():
        store = SqliteStore(cfgmod.Usage(path=str(tmp_path / "u.sqlite3"), flush_interval_s=5))
        now = time.time()
        for i in range(10):
            store.put(_entry(now, key="alice" if i % 2 else "bob"))
        store.put(_entry(now - 3600, key="alice"))
        rows = await store.rows(None, None, None, None)  # queued behind the entries: no 5 s wait
        await store.close()
        return rows, now

    rows, now = asyncio.run(main())
    by = {(d[0], d[1]): v for d, v in rows}
    hour = int(now // 3600) * 3600
    assert set(by) == {(hour, "alice"), (hour, "bob"), (hour - 3600, "alice")}
    assert by[(hour, "alice")][:1] == [5] and by[(hour, "bob")][5] == 50  # requests, input tokens


def test_a_restart_keeps_the_rows_and_the_budget_counts(tmp_path):
    cfg = cfgmod.parse({"usage": {"path": str(tmp_path / "u.sqlite3")},
                        "auth": {"keys": [{"name": "alice", "key": "x", "budget": {"tokens_per_day": 100}}]}})

    async def first():
        ledger = Ledger(cfg)
        for _ in range(7):
            ledger.store.put(_entry(time.time()), True)
        await ledger.close()

    async def second():
        ledger = Ledger(cfg)
        await ledger.start()
        status = await ledger.budget_status()
        err = None
        ledger.store.put(_entry(time.time(), tin=50), True)
        try:
            await ledger.check("alice")
        except Exception as e:  # noqa: BLE001
            err = e
        rows = await ledger.query(by="day")
        await ledger.close()
        return status, err, rows

    asyncio.run(first())
    status, err, rows = asyncio.run(second())
    assert status[0]["used_today"] == 7 * 15 and status[0]["exhausted"]
    assert err is not None and err.status == 429
    (row,) = rows
    assert row["requests"] == 8 and row["input_tokens"] == 120 and row["start_unix"] % 86400 == 0


def test_rows_past_retention_are_deleted(tmp_path):
    async def main():
        store = SqliteStore(cfgmod.Usage(path=str(tmp_path / "u.sqlite3"), retention_days=40))
        store.put(_entry(time.time() - 41 * 86400))
        store.put(_entry(time.time()))
        rows = await store.rows(None, None, None, None)
        await store.close()
        return rows

    rows = asyncio.run(main())
    assert len(rows) == 1 and rows[0][0][0] > time.time() - 86400


def test_no_file_until_the_first_entry(tmp_path):
    async def main():
        store = SqliteStore(cfgmod.Usage(path=str(tmp_path / "sub" / "u.sqlite3")))
        await store.start()
        await store.close()

    asyncio.run(main())
    assert (tmp_path / "sub").is_dir() and not (tmp_path / "sub" / "u.sqlite3").exists()


def test_a_ledger_that_cannot_be_written_stops_the_start(tmp_path):
    (tmp_path / "afile").write_text("")
    store = SqliteStore(cfgmod.Usage(path=str(tmp_path / "afile" / "u.sqlite3")))
    with pytest.raises(cfgmod.ConfigError) as err:
        asyncio.run(store.start())
    assert err.value.problems[0].startswith("usage.path: cannot create")
