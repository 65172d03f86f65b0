"""The gateway state (app/gateway.py) against the Protocols the layers above it are typed with,
its reload of backends, and the metrics it feeds (ops/metrics.py)."""

from __future__ import annotations

import asyncio
import typing

import pytest
from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.ops.context import OpsGateway
from homelab_frontend.surfaces.context import Gateway as SurfaceGateway


def _cfg(tmp_path, backends=("gpu0",)) -> cfgmod.Config:
    return cfgmod.parse({
        "backends": {b: {"url": f"http://127.0.0.1:9/{b}/v1", "slots": 2} for b in backends},
        "models": {"m": {"backends": list(backends)}},
        "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
    })


@pytest.fixture
def gw(tmp_path):
    async def make():
        g = Gateway(_cfg(tmp_path))
        return g
    loop = asyncio.new_event_loop()
    g = loop.run_until_complete(make())
    yield g
    loop.run_until_complete(g.close())
    loop.close()


@pytest.mark.parametrize("protocol", [SurfaceGateway, OpsGateway])
def test_the_gateway_has_everything_its_protocols_declare(gw, protocol):
    declared = set(typing.get_type_hints(protocol, include_extras=False, localns={"ResponsesState": object,
                                                                                  "Metrics": object}))
    declared |= {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    missing = {n for n in declared if not hasattr(gw, n)}
    assert not missing, missing


def test_apply_keeps_pools_and_drops_idle_removed_backends(gw, tmp_path):
    pool = gw.backends["gpu0"].pool
    gw.apply(_cfg(tmp_path, ("gpu0", "gpu1")))
    assert gw.backends["gpu0"].pool is pool  # accounting survives a reload
    assert set(gw.clients) == {"gpu0", "gpu1"}
    gw.backends["gpu1"].pool.in_use = 1  # busy: a removed backend lingers until idle
    gw.apply(_cfg(tmp_path, ("gpu0",)))
    assert "gpu1" in gw.backends
    gw.backends["gpu1"].pool.in_use = 0
    assert gw._drop_if_idle("gpu1")
    assert set(gw.backends) == {"gpu0"} and set(gw.clients) == {"gpu0"}


def test_without_a_cluster_latest_wins_is_in_process_and_redis_is_never_imported(tmp_path):
    # in a fresh interpreter: this test process may have imported redis for other tests
    import subprocess
    import sys

    code = f"""
import asyncio, sys
from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.admission.supersede import Supersede
cfg = cfgmod.parse({{"backends": {{"b": {{"url": "http://127.0.0.1:9/v1"}}}},
                    "models": {{"m": {{"backend": "b", "supersede": True}}}},
                    "responses": {{"store": {{"path": {str(tmp_path / "r.sqlite3")!r}}}}}}})
async def main():
    g = Gateway(cfg)
    assert type(g.supersede) is Supersede and g.shared_supersede is None
    await g.close()
asyncio.run(main())
loaded = sorted(m for m in sys.modules if m == "redis" or m.startswith(("redis.", "homelab_frontend.admission.redis")))
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
