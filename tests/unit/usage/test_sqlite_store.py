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


def test_an_oserror_from_the_folder_is_reported_and_the_writer_lives_on(tmp_path):
    """The folder made at start is replaced by a file: the first write cannot make it (an OSError,
    which used to end the writer thread and leave every later query waiting forever)."""
    import shutil

    from homelab_frontend.errors import GatewayError

    async def main():
        sub = tmp_path / "sub"
        store = SqliteStore(cfgmod.Usage(path=str(sub / "u.sqlite3"), flush_interval_s=0.05))
        await store.start()
        shutil.rmtree(sub)
        sub.write_text("in the way")
        store.put(_entry(time.time()))
        with pytest.raises(GatewayError) as ei:  # the query gets the failure, at once
            await asyncio.wait_for(store.rows(None, None, None, None), 5)
        assert ei.value.status == 503 and "usage ledger" in ei.value.message
        for _ in range(100):
            if store.write_errors:
                break
            await asyncio.sleep(0.02)
        health = store.health()
        assert not health["ok"] and health["writer_alive"] and "cannot write" in health["failure"]
        assert store.write_errors == 1 and store.lost == 1
        sub.unlink()  # the way is clear again: the same thread writes the next batch
        store.put(_entry(time.time()))
        rows = await asyncio.wait_for(store.rows(None, None, None, None), 5)
        assert len(rows) == 1 and store.health()["ok"]
        await store.close()

    asyncio.run(main())


def test_a_writer_thread_that_dies_fails_its_waiting_queries_and_is_started_again(tmp_path, monkeypatch):
    from homelab_frontend.errors import GatewayError

    async def main():
        store = SqliteStore(cfgmod.Usage(path=str(tmp_path / "u.sqlite3"), flush_interval_s=0.05))
        await store.start()
        real_write = store._write

        def bug(batch, n):
            raise RuntimeError("a bug in the writer")

        monkeypatch.setattr(store, "_write", bug)
        store.put(_entry(time.time()))
        with pytest.raises(GatewayError) as ei:  # never a query waiting forever on a dead thread
            await asyncio.wait_for(store.rows(None, None, None, None), 5)
        assert ei.value.status == 503 and "RuntimeError: a bug in the writer" in ei.value.message
        for _ in range(100):
            if not store.health()["writer_alive"]:
                break
            await asyncio.sleep(0.02)
        assert not store.health()["writer_alive"] and "died" in store.failure and store.lost == 1
        monkeypatch.setattr(store, "_write", real_write)
        store.put(_entry(time.time()))  # starts another writer
        rows = await asyncio.wait_for(store.rows(None, None, None, None), 5)
        assert len(rows) == 1 and store.restarts == 1 and store.health()["writer_alive"]
        await store.close()

    asyncio.run(main())


def test_a_file_from_before_the_relayed_units_gets_their_columns(tmp_path):
    """A ledger written by an older gateway: the CLI reads it read-only (the new figures 0), and
    the gateway that opens it adds their columns and counts into them."""
    import sqlite3

    from homelab_frontend.usage.rollup import METRICS
    from homelab_frontend.usage.sqlite_store import read_only, read_rows

    path = str(tmp_path / "old.sqlite3")
    hour = int(time.time() // 3600) * 3600
    old_ints = ("requests", "ok", "cancelled", "failed", "refused", "input_tokens", "cached_tokens",
                "output_tokens", "estimated_input", "estimated_output")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE usage_hour (start INTEGER NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, "
               "upstream TEXT NOT NULL, backend TEXT NOT NULL, dialect TEXT NOT NULL, "
               + ", ".join(f"{m} INTEGER NOT NULL DEFAULT 0" for m in old_ints)
               + ", slot_seconds REAL NOT NULL DEFAULT 0, queue_seconds REAL NOT NULL DEFAULT 0, "
               "load_seconds REAL NOT NULL DEFAULT 0, PRIMARY KEY (start, key, model, upstream, backend, dialect)) "
               "WITHOUT ROWID")
    db.execute("INSERT INTO usage_hour (start, key, model, upstream, backend, dialect, requests) "
               "VALUES (?, 'alice', 'm', 'up', 'b', 'openai', 4)", (hour,))
    db.commit()
    db.close()
    ro = read_only(path)
    [(dims, vals)] = read_rows(ro, None, None, None, None)
    ro.close()
    assert vals[METRICS.index("requests")] == 4 and vals[METRICS.index("documents")] == 0

    async def main():
        store = SqliteStore(cfgmod.Usage(path=path, flush_interval_s=5))
        e = _entry(hour + 1.0)
        store.put(Entry(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "documents": 3, "audio_seconds": 1.5}))
        rows = await store.rows(None, None, None, None)
        await store.close()
        return rows

    [(dims, vals)] = asyncio.run(main())
    assert vals[METRICS.index("requests")] == 5 and vals[METRICS.index("documents")] == 3
    assert vals[METRICS.index("audio_seconds")] == 1.5
