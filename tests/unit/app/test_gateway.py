"""The gateway state (app/gateway.py): its reload of backends, and the metrics it feeds
(ops/metrics.py). (Against the Protocols the layers above it are typed with: tests/unit/ops/
test_context.py and tests/unit/surfaces/test_context.py.)"""

from __future__ import annotations

import asyncio

import pytest
from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway


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


def test_apply_keeps_pools_and_drops_idle_removed_backends(gw, tmp_path):
    pool = gw.backends["gpu0"].pool
    gw.apply(_cfg(tmp_path, ("gpu0", "gpu1")))
    assert gw.backends["gpu0"].pool is pool  # accounting survives a reload
    assert set(gw.clients) == {"gpu0", "gpu1"}
    gw.backends["gpu1"].pool.in_use = 1  # busy: a removed backend lingers until idle
    gw.apply(_cfg(tmp_path, ("gpu0",)))
    assert "gpu1" in gw.backends
    gw.backends["gpu1"].pool.in_use = 0
    assert gw.drop_if_idle("gpu1")
    assert set(gw.backends) == {"gpu0"} and set(gw.clients) == {"gpu0"}


def test_the_clients_address_is_believed_from_the_proxies_the_config_trusts_now(gw, tmp_path):
    from types import SimpleNamespace

    from multidict import CIMultiDict

    def request(peer, **headers):
        return SimpleNamespace(remote=peer, headers=CIMultiDict(headers))

    via_proxy = request("10.0.0.1", **{"X-Forwarded-For": "198.51.100.7, 203.0.113.9"})
    assert gw.client_address(via_proxy) == "10.0.0.1"  # nobody trusted yet
    raw = {"backends": {"gpu0": {"url": "http://127.0.0.1:9/gpu0/v1"}}, "models": {"m": {"backend": "gpu0"}},
           "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
           "connections": {"trusted_proxies": ["10.0.0.0/8"]}}
    gw.apply(cfgmod.parse(raw))  # a reload applies it
    assert gw.client_address(via_proxy) == "203.0.113.9"
    assert gw.client_address(request("192.0.2.1", **{"X-Forwarded-For": "203.0.113.9"})) == "192.0.2.1"
    raw["connections"]["forwarded_header"] = "forwarded"
    gw.apply(cfgmod.parse(raw))
    assert gw.client_address(via_proxy) == "10.0.0.1"  # X-Forwarded-For is no longer read
    assert gw.client_address(request("10.0.0.1", Forwarded="for=203.0.113.10")) == "203.0.113.10"


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


def test_a_large_body_is_parsed_on_a_worker_thread_and_a_small_one_on_the_loop(gw):
    """Off the loop from OFF_LOOP_BYTES on: the thread that ran the parse is the evidence (how
    much that keeps a stream flowing on a busy machine is bench's to measure, not a test's)."""
    import threading

    from homelab_frontend.app.gateway import OFF_LOOP_BYTES

    def where(body: bytes) -> int:
        return threading.get_ident()

    async def main() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        small = await gw.parse(b'{"model": "m"}', where)
        big = await gw.parse(b'{"model": "m", "x": "' + b"a" * OFF_LOOP_BYTES + b'"}', where)
        return loop_thread, small, big

    loop_thread, small, big = asyncio.new_event_loop().run_until_complete(main())
    assert small == loop_thread and big != loop_thread
