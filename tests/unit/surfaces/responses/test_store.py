"""Stored responses (surfaces/responses/store.py): SQLite in a temporary directory and Redis
against a real redis-server; a record is its owner's only, expires, and survives a reopen."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import canonical as c
from homelab_frontend import config as cfgmod
from homelab_frontend.surfaces.responses.store import (
    Record,
    RedisStore,
    SqliteStore,
    decode_record,
    encode_record,
)
from redisproc import RedisServer, available


def _rec(owner: str = "alice") -> Record:
    return Record(owner=owner, response={"id": "resp_1", "output": []},
                  history=[c.Message(role="user", parts=[c.TextPart("hi")])])


def test_records_round_trip_and_a_foreign_one_is_gone():
    rec = _rec()
    assert decode_record(encode_record(rec)) == rec
    assert decode_record(b'{"owner": 1}') is None
    assert decode_record(b"not json") is None


def test_sqlite_owner_delete_and_reopen(tmp_path):
    async def main():
        cfg = cfgmod.ResponseStore(path=str(tmp_path / "r.sqlite3"))
        s = SqliteStore(cfg)
        await s.put("resp_1", _rec())
        assert (await s.get("resp_1", "alice")) == _rec()
        assert await s.get("resp_1", "bob") is None  # another key's response does not exist
        await s.close()
        s = SqliteStore(cfg)  # a restart keeps what was stored
        assert (await s.get("resp_1", "alice")) == _rec()
        assert not await s.delete("resp_1", "bob")
        assert await s.delete("resp_1", "alice")
        assert await s.get("resp_1", "alice") is None
        await s.close()

    asyncio.run(main())


def test_sqlite_expiry(tmp_path):
    async def main():
        s = SqliteStore(cfgmod.ResponseStore(path=str(tmp_path / "r.sqlite3"), ttl_s=0.2))
        await s.put("resp_1", _rec())
        assert await s.get("resp_1", "alice") is not None
        await asyncio.sleep(0.3)
        got = await s.get("resp_1", "alice")
        await s.close()
        return got

    assert asyncio.run(main()) is None


@pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")
def test_redis_store_is_shared_and_owned():
    import redis.asyncio as aioredis

    with RedisServer() as r:
        async def main():
            client = aioredis.Redis(host="127.0.0.1", port=r.port, decode_responses=True)  # as the registry makes it
            cfg = cfgmod.ResponseStore(ttl_s=30)
            a, b = RedisStore(cfg, client), RedisStore(cfg, client)
            await a.put("resp_9", _rec())
            got = await b.get("resp_9", "alice")  # another replica reads it
            assert got == _rec()
            assert await b.get("resp_9", "bob") is None
            assert not await b.delete("resp_9", "bob")
            assert await b.delete("resp_9", "alice")
            assert await a.get("resp_9", "alice") is None
            await a.close()
            await client.aclose()

        asyncio.run(main())
