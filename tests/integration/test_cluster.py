"""Gateway replicas sharing one slot budget through a real redis-server (cluster: section).

Every test runs real gateway processes against one slow stub backend with `slots: 4` and checks
the stub's own count of concurrent generations: whatever happens to a replica or to Redis, the
backend never runs more than 4 for the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_events
from redisproc import RedisServer, TcpRelay, available
from stubproc import start_stub, wait_for

pytestmark = pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")

SLOTS = 4


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "m", "--token-delay-ms", "20") as s:
        yield s


@pytest.fixture
def redis_server():
    with RedisServer() as r:
        yield r


def _config(stub, redis_url: str, replica: str, lease_s: float) -> dict:
    backend = {"url": stub.base, "slots": SLOTS, "queue": {"depth": 64, "timeout_s": 60}}
    return config_for({"b": backend}, {"m": {"backend": "b"}},
                      cluster={"redis_url": redis_url, "lease_s": lease_s, "replica_id": replica})


def _start(stack: ExitStack, stub, lease_s: float, **replicas: str) -> dict[str, Gateway]:
    """replica id -> its Redis URL; the gateways start in parallel (each takes a second)."""
    with ThreadPoolExecutor(len(replicas)) as pool:
        futs = {r: pool.submit(Gateway, _config(stub, url, r, lease_s)) for r, url in replicas.items()}
        gws = {}
        for r, fut in futs.items():
            try:
                gws[r] = stack.enter_context(fut.result())
            except Exception:
                for f in futs.values():  # do not leave the others running
                    if f.exception() is None:
                        stack.enter_context(f.result())
                raise
    return gws


def _request(gw: Gateway, n_tokens: int, dialect: str = "openai", timeout: float = 60):
    prompt = f"[stub content={n_tokens}]"
    if dialect == "openai":
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
        return post_raw(gw.base + "/chat/completions", body, timeout=timeout)
    body = {"model": "m", "stream": True, "max_tokens": 4096, "messages": [{"role": "user", "content": prompt}]}
    return post_raw(gw.base + "/messages", body, timeout=timeout)


def _completed(dialect: str, raw: bytes) -> bool:
    if dialect == "openai":
        return raw.rstrip().endswith(b"data: [DONE]")
    return raw.rstrip().endswith(b'{"type":"message_stop"}')


def _leases(redis_server) -> list[str]:
    return redis_server.client().zrange("hlf:slots:b", 0, -1)


def _in_use_before(redis_server) -> None:
    """Make the fresh Redis look like one the cluster has used for a while: an epoch whose grace
    ended long ago. (A Redis without one grants nothing for its grace; the fresh-cluster test and
    the restart test go through that on purpose.)"""
    redis_server.client().set("hlf:epoch", 0)


class _Background:
    """Requests on threads, so the test can act while they run; `results()` joins them."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._out: list = []

    def start(self, gw: Gateway, n_tokens: int, dialect: str = "openai") -> None:
        i = len(self._out)
        self._out.append(None)

        def run() -> None:
            try:
                status, _, raw = _request(gw, n_tokens, dialect)
                self._out[i] = (dialect, status, raw)
            except OSError as err:  # the replica was killed under it
                self._out[i] = (dialect, None, repr(err).encode())

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self._threads.append(th)

    def done(self) -> bool:
        return not any(th.is_alive() for th in self._threads)

    def results(self, timeout: float = 60) -> list:
        deadline = time.monotonic() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        assert self.done(), "requests still running"
        return list(self._out)


def test_a_fresh_cluster_grants_after_the_discovery_window_not_a_whole_lease(stub, redis_server):
    # no replica holds a slot, so none can have been lost: the first request waits about a
    # second (cluster.DISCOVERY_S), not lease_s (it waited 9.8 s of a 10 s lease before)
    lease_s = 10.0
    stub.reset()
    with ExitStack() as stack:
        gw = _start(stack, stub, lease_s, a=redis_server.url)["a"]
        status, _, raw = _request(gw, 3, "openai", timeout=lease_s)
        assert status == 200 and _completed("openai", raw)
        end, born = map(int, redis_server.client().get("hlf:epoch").split())
        assert end - born == 1000  # the discovery window, recorded by the first script
        line = wait_for(lambda: [r for r in gw.access_log() if r.get("status") == 200], timeout=5)[0]
        assert line["queue_wait_ms"] is not None


def test_replicas_share_the_slots_and_the_backend_never_sees_more(stub, redis_server):
    stub.reset()
    with ExitStack() as stack:
        # lease_s 8: a Redis call may take up to 4 s (half a lease) before Redis counts as gone.
        # When calls were cut at min(1 s, lease_s / 4), a loaded machine got "Redis unreachable"
        # 529s here while Redis was up (test_cluster_redis_pause.py: a Redis that answers late).
        gws = _start(stack, stub, 8.0, a=redis_server.url, b=redis_server.url, c=redis_server.url)
        order = list(gws.values())
        seen: set[tuple[str, str]] = set()  # (replica, request) pairs the admin view showed
        counts: list[int] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                cluster = order[0].admin()["cluster"]["backends"]["b"]
                counts.append(cluster["in_use"])
                seen.update((lease["replica"], lease["request"]) for lease in cluster["leases"])
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            jobs = [(order[i % 3], "openai" if i % 2 else "anthropic") for i in range(30)]
            with ThreadPoolExecutor(30) as pool:
                results = list(pool.map(lambda j: (j[1], *_request(j[0], 10, j[1])), jobs))
        finally:
            stop.set()
            watcher.join()

        for dialect, status, _, raw in results:
            assert status == 200, raw[:300]
            assert _completed(dialect, raw), raw[-200:]
        stats = stub.stats()
        assert stats["completed"] == 30
        assert stats["max_in_flight"] == SLOTS  # all four were used, and never a fifth
        assert max(counts) <= SLOTS
        wait_for(lambda: _leases(redis_server) == [], timeout=5)  # every release reached Redis

        # every replica served, and some requests had to wait for a slot another replica held
        waited = 0
        for replica, gw in gws.items():
            ok = [r for r in gw.access_log() if r.get("status") == 200]
            assert len(ok) == 10, replica
            waited += sum(1 for r in ok if (r.get("queue_wait_ms") or 0) > 100)
            ids = {r["id"] for r in ok}
            # the admin view's "who holds what" names this replica's own requests
            assert {req for rep, req in seen if rep == replica} <= ids
        assert waited >= 10
        assert {rep for rep, _ in seen} == set(gws)  # the view showed slots held by each replica

        view = order[1].admin()
        assert view["cluster"]["reachable"] is True and view["cluster"]["replica"] == "b"
        assert view["backends"]["b"]["in_use"] == 0 and view["backends"]["b"]["held_here"] == 0


def test_a_killed_replica_loses_its_slots_within_the_lease(stub, redis_server):
    lease_s = 4.0  # short, for the test's length; Redis counts as gone after 2 s without an answer
    stub.reset()
    _in_use_before(redis_server)
    with ExitStack() as stack:
        gws = _start(stack, stub, lease_s, a=redis_server.url, b=redis_server.url)
        a, b = gws["a"], gws["b"]
        doomed = _Background()
        for _ in range(SLOTS):
            doomed.start(a, 2000)  # 40 s: they end only because their replica dies
        wait_for(lambda: len([m for m in _leases(redis_server) if m.startswith("a:")]) == SLOTS, timeout=30)
        wait_for(lambda: stub.stats()["in_flight"] == SLOTS, timeout=30)

        # B sees A's hold, in its admin view and its metrics
        view = b.admin()["cluster"]["backends"]["b"]
        assert view["in_use"] == SLOTS and view["replicas"] == {"a": SLOTS}
        wait_for(lambda: 'hlf_cluster_replica_slots_in_use{backend="b",replica="a"} 4.0'
                 in b.get("/metrics")[1], timeout=lease_s)

        survivors = _Background()
        survivors.start(b, 50)  # queued on B behind A's slots
        wait_for(lambda: b.admin()["backends"]["b"]["queued"] == 1, timeout=5)

        a.proc.kill()  # SIGKILL: no shutdown, no release, its leases just stop being renewed
        a.proc.wait()
        for _ in range(SLOTS - 1):
            survivors.start(b, 50)
        # all four slots are B's again within lease_s (+1 s for polling and process start-up)
        wait_for(lambda: b.admin()["backends"]["b"]["held_here"] == SLOTS, timeout=lease_s + 1)
        assert all(m.startswith("b:") for m in _leases(redis_server))

        for dialect, status, raw in survivors.results():
            assert status == 200 and _completed(dialect, raw), raw[-200:]
        assert not any(status == 200 and _completed(d, raw) for d, status, raw in doomed.results())
        assert stub.stats()["max_in_flight"] <= SLOTS


def test_redis_restart_refuses_new_work_keeps_running_requests(stub, redis_server):
    # from the stop to the leases' re-registration (two refusals, the admin read, redis-server's
    # start, the next renewal round) must fit in a lease less a renewal period: with 4 s leases
    # that was 2.2-3.5 s, and a busy machine's restart once took longer, fencing a running stream
    lease_s = 8.0
    stub.reset()
    _in_use_before(redis_server)
    with ExitStack() as stack:
        gws = _start(stack, stub, lease_s, a=redis_server.url, b=redis_server.url)
        a, b = gws["a"], gws["b"]
        running = _Background()
        for i in range(SLOTS):  # 12 s streams, two on each replica, one per dialect: they outlast the restart
            running.start(a if i % 2 else b, 600, "openai" if i < 2 else "anthropic")
        wait_for(lambda: len(_leases(redis_server)) == SLOTS, timeout=lease_s + 3)

        redis_server.stop()
        # new work is refused at once, in each dialect's overload shape, with Retry-After
        status, headers, raw = _request(a, 5, "openai", timeout=10)
        assert status == 429 and int(headers["retry-after"]) >= 1
        err = json.loads(raw)["error"]
        assert err["type"] == "rate_limit_error" and "Redis" in err["message"]
        status, headers, raw = _request(b, 5, "anthropic", timeout=10)
        assert status == 529 and int(headers["retry-after"]) >= 1
        assert json.loads(raw)["error"]["type"] == "overloaded_error"
        down = b.admin()
        assert down["cluster"]["reachable"] is False and down["backends"]["b"]["held_here"] == 2

        redis_server.start()  # empty: no persistence
        # the running requests' leases come back; nobody else gets a slot meanwhile
        wait_for(lambda: sorted(m[0] for m in _leases(redis_server)) == ["a", "a", "b", "b"], timeout=3)
        # replicas that held slots re-registered them: the grace is the whole lease, not the
        # fresh cluster's discovery window
        end, born = map(int, redis_server.client().get("hlf:epoch").split())
        assert end - born == int(lease_s * 1000)
        wait_for(lambda: a.admin()["cluster"]["reachable"] and b.admin()["cluster"]["reachable"], timeout=3)
        later = _Background()
        for i in range(SLOTS):
            later.start(a if i % 2 else b, 5, "anthropic" if i % 2 else "openai")

        for dialect, status, raw in running.results():
            assert status == 200 and _completed(dialect, raw), raw[-200:]
        for dialect, status, raw in later.results():
            assert status == 200 and _completed(dialect, raw), raw[-200:]
        stats = stub.stats()
        assert stats["cancelled"] == 0 and stats["max_in_flight"] <= SLOTS
        assert stats["completed"] == 2 * SLOTS
        assert b.admin()["cluster"]["reachable"] is True
        rejected = [r for gw in (a, b) for r in gw.access_log() if r.get("outcome") == "rejected_overloaded"]
        assert len(rejected) == 2


def test_a_replica_cut_off_from_redis_stops_its_requests_before_others_reuse_the_slots(stub, redis_server):
    """A network partition: A loses Redis, B does not. A's leases expire and B takes the slots,
    so A must have stopped its requests by then, or the backend would run 8."""
    lease_s = 4.0  # its Redis calls time out at lease_s / 4: 0.5 s was within a busy machine's reach
    stub.reset()
    _in_use_before(redis_server)
    with ExitStack() as stack:
        relay = stack.enter_context(TcpRelay(redis_server.port))
        gws = _start(stack, stub, lease_s, a=f"redis://127.0.0.1:{relay.port}/0", b=redis_server.url)
        a, b = gws["a"], gws["b"]
        cut_off = _Background()
        for i in range(SLOTS):
            cut_off.start(a, 2000, "openai" if i % 2 else "anthropic")
        wait_for(lambda: len([m for m in _leases(redis_server) if m.startswith("a:")]) == SLOTS, timeout=30)
        wait_for(lambda: stub.stats()["in_flight"] == SLOTS, timeout=30)

        relay.cut()
        others = _Background()
        for _ in range(SLOTS):
            others.start(b, 50)  # 1 s each, once A's leases have expired
        # A's requests end with an error in their dialect before the lease runs out: no hang
        results = cut_off.results(timeout=lease_s + 5)
        for dialect, status, raw in results:
            assert status == 200  # the streams had started; the error is in-band
            assert not _completed(dialect, raw)
            if dialect == "openai":
                assert b"lease" in raw.split(b"data: ")[-1]
            else:
                name, data = sse_events(raw)[-1]
                assert name == "error" and "lease" in data["error"]["message"]
        for dialect, status, raw in others.results():
            assert status == 200 and _completed(dialect, raw), raw[-200:]
        stats = stub.stats()
        assert stats["max_in_flight"] <= SLOTS and stats["cancelled"] == SLOTS
        stopped = [r for r in a.access_log() if r.get("outcome") == "error_overloaded"]
        assert len(stopped) == SLOTS  # counted as the gateway's overload, not the backend's fault

        # still cut off: new work is refused at once
        status, headers, _ = _request(a, 5, "openai", timeout=10)
        assert status == 429 and "retry-after" in headers
        relay.heal()
        wait_for(lambda: a.admin()["cluster"]["reachable"], timeout=5)
        status, _, raw = _request(a, 5, "anthropic", timeout=20)
        assert status == 200 and _completed("anthropic", raw)
        wait_for(lambda: _leases(redis_server) == [], timeout=5)


def test_an_unresponsive_redis_never_hangs_a_request(stub, redis_server):
    """Redis frozen (SIGSTOP): connections stay open but nothing answers. Every call is bounded
    (half a lease, 3 s here), so new requests are refused within it and the running ones carry on."""
    lease_s = 6.0
    stub.reset()
    _in_use_before(redis_server)
    with ExitStack() as stack:
        a = _start(stack, stub, lease_s, a=redis_server.url)["a"]
        running = _Background()
        running.start(a, 150, "openai")
        running.start(a, 150, "anthropic")
        wait_for(lambda: len(_leases(redis_server)) == 2, timeout=5)
        # both held here; read before the freeze, since the two streams (150 tokens at 20 ms) end
        # about when the first refusal (half a lease) comes, and a read after it races them
        wait_for(lambda: a.admin()["cluster"]["backends"]["b"]["held_here"] == 2, timeout=5)

        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            # a hang would fail these on the client's own 5 s timeout
            status, headers, _ = _request(a, 5, "anthropic", timeout=5)
            assert status == 529 and int(headers["retry-after"]) >= 1
            status, headers, _ = _request(a, 5, "openai", timeout=5)
            assert status == 429 and int(headers["retry-after"]) >= 1
            assert a.admin()["cluster"]["reachable"] is False
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)

        wait_for(lambda: a.admin()["cluster"]["reachable"], timeout=5)
        for dialect, status, raw in running.results():
            assert status == 200 and _completed(dialect, raw), raw[-200:]
        status, _, raw = _request(a, 5, "openai", timeout=20)
        assert status == 200 and _completed("openai", raw)
        assert stub.stats()["cancelled"] == 0
