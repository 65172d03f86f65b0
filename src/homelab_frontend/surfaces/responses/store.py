"""Stored responses (`store: true`): what `previous_response_id`, GET and DELETE
/llm/v1/responses/{id} read.

A record is the Response object as the client got it plus the conversation it ended (the
canonical messages of every earlier turn, this turn's input and its answer, instructions left out:
the API does not carry them over), so continuing a conversation never depends on re-parsing
client JSON. It belongs to the API key that made it (its name; "" when the gateway has no keys):
another key asking for it gets the same 404 as for an id that never existed.

Two places to keep them:

* `SqliteStore` (the default): one SQLite file. Every call runs on one worker thread that owns the
  connection, never on the event loop (a write waits on the disk). Bounded twice: a record older
  than `ttl_s` is never returned and is deleted on the next write, and beyond `max_bytes` in total
  the oldest records go first. The file is created on first use, so a gateway that never stores a
  response never touches the disk.
* `RedisStore`, when the config has a `cluster:` section: the same Redis the replicas share slots
  through, so any replica can continue a conversation another one started. Records expire by
  Redis TTL; a sorted index by age and a byte counter, updated in one Lua script per write, keep
  the total under `max_bytes` the same way.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from ... import canonical as c
from ...config import ResponseStore as StoreConfig


class Record(msgspec.Struct):
    owner: str
    response: dict
    history: list[c.Message]
    input_items: list[dict] = []  # this request's input as items (request.py), with their ids


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Record).decode


def encode_record(rec: Record) -> bytes:
    return _encode(rec)


def decode_record(raw: bytes | str) -> Record | None:
    try:
        return _decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # written by an incompatible version: as good as gone


def default_path() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "homelab-frontend", "responses.sqlite3")


class SqliteStore:
    def __init__(self, cfg: StoreConfig) -> None:
        self.path = cfg.path or default_path()
        self.ttl_s = cfg.ttl_s
        self.max_bytes = cfg.max_bytes
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hlf-responses-store")
        self._db: sqlite3.Connection | None = None
        self._total = 0

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- on the worker thread -------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                       "created REAL NOT NULL, size INTEGER NOT NULL, body BLOB NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses(created)")
            self._total = db.execute("SELECT total(size) FROM responses").fetchone()[0] or 0
            self._db = db
        return self._db

    def _put(self, resp_id: str, owner: str, body: bytes) -> None:
        db = self._conn()
        now = time.time()
        with db:
            db.execute("BEGIN")
            old = db.execute("SELECT total(size) FROM responses WHERE created < ? OR id = ?",
                             (now - self.ttl_s, resp_id)).fetchone()[0] or 0
            db.execute("DELETE FROM responses WHERE created < ? OR id = ?", (now - self.ttl_s, resp_id))
            db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)", (resp_id, owner, now, len(body), body))
            self._total += len(body) - int(old)
            while self._total > self.max_bytes:
                rows = db.execute("SELECT id, size FROM responses ORDER BY created LIMIT 64").fetchall()
                if not rows:
                    break
                for rid, size in rows:
                    db.execute("DELETE FROM responses WHERE id = ?", (rid,))
                    self._total -= size
                    if self._total <= self.max_bytes:
                        break

    def _get(self, resp_id: str, owner: str) -> bytes | None:
        row = self._conn().execute("SELECT owner, created, body FROM responses WHERE id = ?", (resp_id,)).fetchone()
        if row is None or row[0] != owner or row[1] < time.time() - self.ttl_s:
            return None
        return row[2]

    def _delete(self, resp_id: str, owner: str) -> bool:
        db = self._conn()
        row = db.execute("SELECT size FROM responses WHERE id = ? AND owner = ?", (resp_id, owner)).fetchone()
        if row is None:
            return False
        db.execute("DELETE FROM responses WHERE id = ?", (resp_id,))
        self._total -= row[0]
        return True

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- the API ---------------------------------------------------------------------------

    async def put(self, resp_id: str, rec: Record) -> None:
        await self._run(self._put, resp_id, rec.owner, encode_record(rec))

    async def get(self, resp_id: str, owner: str) -> Record | None:
        raw = await self._run(self._get, resp_id, owner)
        return decode_record(raw) if raw is not None else None

    async def delete(self, resp_id: str, owner: str) -> bool:
        return await self._run(self._delete, resp_id, owner)

    async def close(self) -> None:
        await self._run(self._close)
        self._pool.shutdown(wait=False)


# KEYS: index, bytes counter, record key. ARGV: id, owner, body, ttl_ms, max_bytes, key prefix.
# Index members are "<id>:<size>" scored by creation time (ms), so expired and evicted records can
# be subtracted from the counter without reading them.
_PUT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
local function forget(m)
  local size = tonumber(string.match(m, ':(%d+)$')) or 0
  redis.call('DECRBY', KEYS[2], size)
  redis.call('ZREM', KEYS[1], m)
  return string.match(m, '^(.*):%d+$')
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)) do forget(m) end
local prev = redis.call('HGET', KEYS[3], 'size')
if prev then forget(ARGV[1] .. ':' .. prev) end
local size = string.len(ARGV[3])
redis.call('HSET', KEYS[3], 'owner', ARGV[2], 'body', ARGV[3], 'size', size)
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1] .. ':' .. size)
redis.call('INCRBY', KEYS[2], size)
while tonumber(redis.call('GET', KEYS[2]) or '0') > tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #oldest == 0 then break end
  redis.call('DEL', ARGV[6] .. forget(oldest[1]))
end
return 1
"""
# KEYS: index, bytes counter, record key. ARGV: id, owner.
_DELETE = """
local owner = redis.call('HGET', KEYS[3], 'owner')
if owner ~= ARGV[2] then return 0 end
local size = redis.call('HGET', KEYS[3], 'size') or '0'
redis.call('DEL', KEYS[3])
if redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. size) == 1 then redis.call('DECRBY', KEYS[2], size) end
return 1
"""


class RedisStore:
    PREFIX = "hlf:responses:"

    def __init__(self, cfg: StoreConfig, client) -> None:
        self.client = client  # the cluster registry's (strings in, strings out)
        self.ttl_ms = max(1, int(cfg.ttl_s * 1000))
        self.max_bytes = cfg.max_bytes
        self._put = client.register_script(_PUT)
        self._delete = client.register_script(_DELETE)
        self._keys = (self.PREFIX + "index", self.PREFIX + "bytes")

    def _key(self, resp_id: str) -> str:
        return self.PREFIX + "r:" + resp_id

    async def put(self, resp_id: str, rec: Record) -> None:
        body = encode_record(rec).decode()
        await self._put(keys=[*self._keys, self._key(resp_id)],
                        args=[resp_id, rec.owner, body, self.ttl_ms, self.max_bytes, self.PREFIX + "r:"])

    async def get(self, resp_id: str, owner: str) -> Record | None:
        got = await self.client.hmget(self._key(resp_id), "owner", "body")
        if not got or got[0] != owner or got[1] is None:
            return None
        return decode_record(got[1])

    async def delete(self, resp_id: str, owner: str) -> bool:
        return bool(await self._delete(keys=[*self._keys, self._key(resp_id)], args=[resp_id, owner]))

    async def close(self) -> None:
        pass  # the client belongs to the cluster registry
