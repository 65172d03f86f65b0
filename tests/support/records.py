"""Request records as the unit tests need them: a `Tracked` made where the gateway makes them
(inside a task), and the fields of one that the usage ledger reads (usage/record.py's `entry_of`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from homelab_frontend.request import tracker as tr
from homelab_frontend.request.tracker import Tracked


def tracked() -> Tracked:
    """A record made where the gateway makes them: inside a task (it notes its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async def make() -> Tracked:
            return Tracked(tr.new_request_id(), "openai", "m", None, False)
        return asyncio.run(make())
    return Tracked(tr.new_request_id(), "openai", "m", None, False)


def usage_record(**kw: Any) -> SimpleNamespace:
    """What the ledger reads of a finished request, `kw` over a plain one."""
    base = dict(key_name="alice", model="m", upstream_model="up", backend="b", dialect="openai",
                tokens_in=None, tokens_out=0, tokens_cached=None, slot_seconds=0.0, queue_wait=None, load_wait=0.0,
                outcome="ok", body_bytes=400, upstream_headers=None, units=None)
    return SimpleNamespace(**{**base, **kw})
