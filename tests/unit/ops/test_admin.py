"""The admin snapshot (ops/admin.py): what runs and queues, per backend, never a URL."""

from __future__ import annotations

import asyncio

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.ops.admin import snapshot
from homelab_frontend.request.tracker import Tracked


def test_snapshot(tmp_path):
    async def main():
        gw = Gateway(cfgmod.parse({
            "backends": {"gpu0": {"url": "http://10.1.2.3:8000/v1", "slots": 4}},
            "models": {"m": {"backend": "gpu0"}},
            "responses": {"store": {"path": str(tmp_path / "r.sqlite3")}},
        }))
        try:
            t = Tracked("req_s", "anthropic", "m", "alice", True)
            t.backend = "gpu0"
            gw.tracker.add(t)
            b = gw.backends["gpu0"]
            b.pool.in_use, b.upstream_running = 1, 3
            return snapshot(gw)
        finally:
            await gw.close()

    snap = asyncio.run(main())
    assert [r["id"] for r in snap["requests"]] == ["req_s"]
    assert snap["backends"]["gpu0"] == {"slots": 4, "in_use": 1, "queued": 0, "up": True, "last_error": None,
                                        "upstream_running": 3, "upstream_running_age_s": None,
                                        "slot_mismatch": 2}
    assert "10.1.2.3" not in repr(snap)  # internal addresses stay internal
