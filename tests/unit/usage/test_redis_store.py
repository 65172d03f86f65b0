"""usage/redis_store.py against a real redis-server: rows a failed write took are put back and
summed with what gathered since (Rollup.put_back, the one row merge), so nothing is lost or
counted twice when Redis comes back."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.usage.record import Entry
from homelab_frontend.usage.redis_store import RedisStore
from homelab_frontend.usage.rollup import Rollup, aggregate
from redisproc import RedisServer, available

T0 = 1_796_119_200.0  # 2026-12-01T10:00:00Z


def _entry(tokens_in: int, output: int, ts: float = T0 + 60) -> Entry:
    return Entry(ts=ts, key="alice", model="m", upstream="up", backend="b", dialect="openai", outcome="ok",
                 input_tokens=tokens_in, cached_tokens=0, output_tokens=output, input_exact=True,
                 output_exact=True, slot_seconds=0.25, queue_seconds=0.0, load_seconds=0.0)


def test_put_back_sums_into_what_gathered_since():
    roll = Rollup()
    roll.add(_entry(10, 1))
    taken = roll.take()
    roll.add(_entry(5, 2))
    roll.add(_entry(1, 1, ts=T0 + 7200))  # another hour: its own row
    roll.put_back(taken)
    rows = aggregate(roll.take().items())
    assert [(r["requests"], r["input_tokens"], r["output_tokens"], r["slot_seconds"]) for r in rows] == [
        (2, 15, 3, 0.5), (1, 1, 1, 0.25)]


@pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")
def test_a_write_redis_refused_goes_with_the_next_one():
    import redis.asyncio as aioredis

    async def run(server: RedisServer) -> list[dict]:
        client = aioredis.from_url(server.url, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)
        store = RedisStore(cfgmod.Usage(flush_interval_s=3600), client)
        try:
            store.put(_entry(10, 1))
            server.stop()
            await store.flush()  # Redis is gone: the rows stay pending
            assert store.written == 0 and store.pending.rows
            store.put(_entry(5, 2))
            server.start()
            await store.flush()
            assert store.written == 2 and not store.pending.rows
            return aggregate(await store.rows(None, None, None, None))
        finally:
            await store.close()
            await client.aclose()

    with RedisServer() as server:
        rows = asyncio.run(run(server))
    assert [(r["requests"], r["input_tokens"], r["output_tokens"]) for r in rows] == [(2, 15, 3)]
