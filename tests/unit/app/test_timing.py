"""The Server-Timing header (app/timing.py): queue, upstream and the gateway's own share."""

from __future__ import annotations

import asyncio
import re
import time

from homelab_frontend.app.timing import server_timing
from homelab_frontend.request.tracker import Tracked


def _record() -> Tracked:
    async def make():
        return Tracked("req_1", "openai", "m", None, False)
    return asyncio.run(make())


def _parts(header: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"(\w+);dur=([0-9.]+)", header)}


def test_only_the_parts_reached():
    t = _record()
    assert list(_parts(server_timing(t))) == ["gw"]
    t.queue_wait = 0.25
    assert list(_parts(server_timing(t))) == ["queue", "gw"]
    t.upstream_headers = 0.5
    parts = _parts(server_timing(t))
    assert list(parts) == ["queue", "upstream", "gw"]
    assert parts["queue"] == 250.0 and parts["upstream"] == 500.0


def test_the_gateway_share_is_the_rest_and_never_negative():
    t = _record()
    t.started = time.monotonic() - 1.0
    t.queue_wait = 0.4
    t.upstream_headers = 0.5
    gw = _parts(server_timing(t))["gw"]
    assert 99 <= gw < 200
    t.queue_wait = 5.0  # more than the whole age: clock skew between the parts
    assert _parts(server_timing(t))["gw"] == 0.0
