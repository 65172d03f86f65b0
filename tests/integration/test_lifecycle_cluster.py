"""Managed backends with replicas (`cluster:` through a real redis-server): one replica runs the
server, the others route to it; when that replica is killed, another takes over after the lease.
Judged by the processes: the server's pid and its parent."""

from __future__ import annotations

import signal
import threading
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


def _stub_stats(port: int) -> dict:
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stub/stats", timeout=5) as r:
            return json.loads(r.read())
    except OSError:  # not started yet
        return {}


def test_a_replica_cut_off_from_redis_stops_a_request_that_waited_for_its_managed_server():
    """The lease of a request that waited for its managed server to start is the request's own:
    when its replica loses Redis for longer than the lease, that stream is stopped like any other
    (before another replica may take the slot), not left to run on a lease nobody holds.

    Replica A runs the managed server (the leader); replica B reaches Redis through a relay the
    test cuts. B streams one answer from the managed backend (it waited for the server to start)
    and one from an external backend; both must end with the lease error within the lease."""
    from contextlib import ExitStack

    from redisproc import TcpRelay
    from stubproc import start_stub

    lease_s = 2.0
    port = free_port()
    managed = stub_backend("vllm", "--start-delay-s", "1", "--token-delay-ms", "20", port=port, slots=2)
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer())
        redis.client().set("hlf:epoch", 0)  # a Redis the cluster has used for a while: no grace
        ext = stack.enter_context(start_stub("vllm", "--model", "x", "--token-delay-ms", "20"))
        relay = stack.enter_context(TcpRelay(redis.port))

        def cfg(replica, url):
            return config_for({"a": managed, "ext": {"url": ext.base, "slots": 2}},
                              {"m": {"backend": "a"}, "x": {"backend": "ext"}}, resources={"gpu": 1},
                              cluster={"redis_url": url, "lease_s": lease_s, "replica_id": replica})

        a = stack.enter_context(Gateway(cfg("ra", redis.url)))
        wait_for(lambda: backends(a)["a"]["leader"] == "ra", 10)
        b = stack.enter_context(Gateway(cfg("rb", f"redis://127.0.0.1:{relay.port}/0")))
        wait_for(lambda: backends(b)["a"]["leader"] == "ra", 10)
        assert backends(a)["a"]["state"] == "stopped"

        out: dict[str, tuple] = {}

        def stream(model: str) -> None:
            body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "[stub content=2000]"}]}
            out[model] = post_raw(b.base + "/chat/completions", body, timeout=120)

        threads = [threading.Thread(target=stream, args=(m,), name=m, daemon=True) for m in ("m", "x")]
        for th in threads:
            th.start()
        # both streams run on B: the managed one after waiting for A to start its server
        wait_for(lambda: _stub_stats(port).get("in_flight") == 1 and ext.stats()["in_flight"] == 1, timeout=30)
        members = redis.client().zrange("hlf:slots:a", 0, -1)
        assert len(members) == 1 and members[0].startswith("rb:"), members

        relay.cut()
        for th in threads:
            th.join(lease_s + 5)
        running = [th.name for th in threads if th.is_alive()]
        assert not running, f"streams of {running} ran on after their replica lost Redis for longer than the lease"
        for model in ("m", "x"):
            status, _, raw = out[model]
            assert status == 200
            assert not raw.rstrip().endswith(b"data: [DONE]"), model
            assert b"lease" in raw.split(b"data: ")[-1], (model, raw[-300:])
        # the managed server saw its generation cancelled, as the external one did
        wait_for(lambda: _stub_stats(port).get("in_flight") == 0 and ext.stats()["in_flight"] == 0, timeout=5)
        relay.heal()
