"""Managed backends with replicas (`cluster:` through a real redis-server): one replica runs the
server, the others route to it; when that replica is killed, another takes over after the lease.
Judged by the processes: the server's pid and its parent."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from gwproc import Gateway, config_for
from managed import alive, backends, stub_backend, wait_gone
from rawhttp import post_raw
from redisproc import RedisServer, available
from stubproc import free_port, wait_for

pytestmark = pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")
LEASE_S = 1.0


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def gateway_of(pid: int) -> int:
    """The gateway that runs a managed server: its parent is the process supervisor."""
    return parent(parent(pid))


def chat(gw):
    return post_raw(gw.base + "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    timeout=60)


def test_one_replica_runs_the_server_the_other_routes_to_it_and_takes_over_after_the_lease():
    port = free_port()
    backend = stub_backend("vllm", "--start-delay-s", "0.5", port=port)
    with RedisServer() as redis:
        def cfg(replica):
            return config_for({"a": backend}, {"m": {"backend": "a"}}, resources={"gpu": 1},
                              cluster={"redis_url": redis.url, "lease_s": LEASE_S, "replica_id": replica})
        with ThreadPoolExecutor(2) as pool:
            one, two = pool.map(lambda r: Gateway(cfg(r)), ["r1", "r2"])
        try:
            gws = {"r1": one, "r2": two}
            # both replicas answer; the server is started once, by the lease holder
            for gw in (two, one, two):
                status, _, raw = chat(gw)
                assert status == 200, raw
            pids = {r: backends(gw)["a"]["pid"] for r, gw in gws.items()}
            assert pids["r1"] == pids["r2"] and pids["r1"] is not None, pids
            pid = pids["r1"]
            runner = next(r for r, gw in gws.items() if gw.proc.pid == gateway_of(pid))
            other = "r2" if runner == "r1" else "r1"
            assert backends(gws[other])["a"]["leader"] == runner
            # the runner dies: its server dies with it, the other replica takes over and starts it
            gws[runner].signal(signal.SIGKILL)
            gws[runner].proc.wait(10)
            wait_gone(pid)
            wait_for(lambda: backends(gws[other])["a"]["leader"] == other, 10 * LEASE_S)
            status, _, raw = chat(gws[other])
            assert status == 200, raw
            new = backends(gws[other])["a"]["pid"]
            assert new not in (None, pid) and alive(new) and gateway_of(new) == gws[other].proc.pid
        finally:
            one.stop()
            two.stop()
