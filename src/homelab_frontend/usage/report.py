"""`homelab-frontend usage`: the ledger read straight from its store, no gateway running: the
SQLite file read-only, or the cluster's Redis. A table per key x model (totals, or per UTC hour
or day with `--by`), or the rows as JSON."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from .. import config as cfgmod
from .rollup import aggregate, totals
from .sqlite_store import default_path, read_only, read_rows

COLUMNS = ("key", "model", "requests", "input", "cached", "output")
# the relayed calls' units (rerank, speech, images): a column only when some row has them
UNIT_COLUMNS = ("documents", "characters", "audio_s", "images")
_FIELDS = {"input": "input_tokens", "cached": "cached_tokens", "output": "output_tokens", "audio_s": "audio_seconds"}
_NUMERIC = {"requests", "input", "cached", "output", *UNIT_COLUMNS}


async def _redis_rows(cfg: cfgmod.Config, since, until, key, model):
    import redis.asyncio as aioredis

    from .redis_store import RedisStore

    client = aioredis.from_url(cfg.cluster.redis_url, decode_responses=True, socket_timeout=5)  # type: ignore[union-attr]
    try:
        return await RedisStore(cfg.usage, client).rows(since, until, key, model)
    finally:
        await client.aclose()


def rows(cfg: cfgmod.Config, since=None, until=None, key=None, model=None, by: str | None = None) -> list[dict]:
    if cfg.cluster is not None:
        stored = asyncio.run(_redis_rows(cfg, since, until, key, model))
    else:
        db = read_only(cfg.usage.path or default_path())
        if db is None:
            return []
        try:
            stored = read_rows(db, since, until, key, model)
        finally:
            db.close()
    got = aggregate(stored, by or "hour")
    return got if by else totals(got)


def where(cfg: cfgmod.Config) -> str:
    if cfg.cluster is not None:
        parts = urlsplit(cfg.cluster.redis_url)  # host and port only: a URL may carry a password
        return f"the ledger in Redis at {parts.hostname or parts.path}:{parts.port or ''}"
    return f"the ledger file {cfg.usage.path or default_path()}"


def _cell(r: dict, c: str) -> str:
    return _num(r[_FIELDS.get(c, c)])


def _num(v: float) -> str:
    return str(round(v, 3)) if isinstance(v, float) else str(v)


def table(found: list[dict], by: str | None) -> str:
    units = tuple(c for c in UNIT_COLUMNS if any(r.get(_FIELDS.get(c, c)) for r in found))
    cols = (("start",) if by else ()) + COLUMNS + units
    lines = [[_cell(r, c) if c != "key" else (r["key"] or "(no key)") for c in cols] for r in found]
    lines.append([""] * len(cols))
    if found:
        total = ["total"] + [""] * (len(cols) - 1)
        for i, c in enumerate(cols):
            if c in _NUMERIC:
                total[i] = _num(sum(r[_FIELDS.get(c, c)] for r in found))
        lines[-1] = total
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(cols)]
    numeric = _NUMERIC

    def fmt(cells) -> str:
        return "  ".join(cell.rjust(w) if c in numeric else cell.ljust(w)
                         for c, cell, w in zip(cols, cells, widths)).rstrip()

    out = [fmt(cols)] + [fmt(line) for line in lines[:-1]]
    if found:
        out.append(fmt(lines[-1]))
    return "\n".join(out)


def dumps(found: list[dict]) -> str:
    return json.dumps({"rows": found}, indent=2)
