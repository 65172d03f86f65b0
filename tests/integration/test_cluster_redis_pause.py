"""A Redis that answers late is not a Redis that is gone (admission/redis_registry.py, "Late is not
gone"): real gateway replicas, a real redis-server frozen with SIGSTOP, the stub backend's own
count of concurrent generations.

- Paused for 1.5 s under load (a fork for a snapshot, a busy host, a VM's hiccup): every request
  is answered (each also reads its key's token budget in Redis first), the backend never runs
  more than its slots, and nothing is left in Redis.
- Silent for longer than a lease: new work is refused with each dialect's overload error once
  Redis counts as gone (half a lease), and running work is stopped before its lease could end.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_events
from redisproc import RedisServer, available
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
        r.client().set("hlf:epoch", 0)  # a Redis in use for a while: no fresh-epoch grace
        yield r


# a key with a token budget: its every request reads the budget's counters in Redis first
BUDGETED = {"keys": [{"name": "team", "key_env": "TEAM_KEY", "budget": {"tokens_per_day": 10_000_000}}],
            "admin_key_env": "ADMIN_KEY"}
TEAM = {"authorization": "Bearer sk-team"}
ADMIN = {"authorization": "Bearer sk-adm"}


def _start(stack: ExitStack, stub, redis_server, lease_s: float, replicas: str, auth: dict | None = None
           ) -> list[Gateway]:
    backend = {"url": stub.base, "slots": SLOTS, "queue": {"depth": 64, "timeout_s": 60}}
    extra = {"auth": auth} if auth else {}
    cfgs = [config_for({"b": backend}, {"m": {"backend": "b"}},
                       cluster={"redis_url": redis_server.url, "lease_s": lease_s, "replica_id": r}, **extra)
            for r in replicas]
    env = {"TEAM_KEY": "sk-team", "ADMIN_KEY": "sk-adm"}
    with ThreadPoolExecutor(len(cfgs)) as pool:
        futs = [pool.submit(Gateway, c, env) for c in cfgs]
        gws = []
        for f in futs:  # every one entered, so a failed start leaves none running
            try:
                gws.append(stack.enter_context(f.result()))
            except Exception:
                for g in futs:
                    if g.exception() is None and g.result() not in gws:
                        stack.enter_context(g.result())
                raise
    return gws


def _stream(gw: Gateway, n_tokens: int, dialect: str, timeout: float = 60, headers: dict | None = None):
    prompt = f"[stub content={n_tokens}]"
    if dialect == "openai":
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
        return post_raw(gw.base + "/chat/completions", body, headers, timeout=timeout)
    body = {"model": "m", "stream": True, "max_tokens": 4096, "messages": [{"role": "user", "content": prompt}]}
    return post_raw(gw.base + "/messages", body, headers, timeout=timeout)


def _completed(dialect: str, raw: bytes) -> bool:
    if dialect == "openai":
        return raw.rstrip().endswith(b"data: [DONE]")
    return raw.rstrip().endswith(b'{"type":"message_stop"}')


@contextmanager
def _frozen(redis_server):
    """redis-server stopped (SIGSTOP): its connections stay open, nothing answers. Always resumed."""
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)


def _nothing_left(redis_server, gws: list[Gateway]) -> None:
    """No lease in Redis, no key but the epoch (and the usage ledger's), and no replica holding or
    queueing anything."""
    keys = lambda: sorted(k for k in redis_server.client().keys("hlf:*") if not k.startswith("hlf:usage:"))  # noqa: E731
    try:
        wait_for(lambda: keys() == ["hlf:epoch"], timeout=10)
    except AssertionError:
        raise AssertionError(f"left in Redis: {keys()}") from None
    for gw in gws:
        b = wait_for(lambda gw=gw: (lambda v: v if v["held_here"] == 0 and v["queued"] == 0 else None)(
            gw.admin(ADMIN)["backends"]["b"]), timeout=10)
        assert b["in_use"] == 0


def test_a_redis_paused_for_a_second_and_a_half_under_load_answers_every_request(stub, redis_server):
    stub.reset()
    with ExitStack() as stack:
        gws = _start(stack, stub, redis_server, 8.0, "abc", auth=BUDGETED)
        results: list = []
        lock = threading.Lock()

        def one(i: int) -> None:
            dialect = "openai" if i % 2 else "anthropic"
            try:
                status, _, raw = _stream(gws[i % 3], 15, dialect, headers=TEAM)
            except OSError as err:
                status, raw = None, repr(err).encode()
            with lock:
                results.append((dialect, status, raw))

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(48)]
        for th in threads[:24]:
            th.start()
        wait_for(lambda: stub.stats()["in_flight"] == SLOTS, timeout=30)  # the slots are in use
        with _frozen(redis_server):
            for th in threads[24:]:  # a second wave arrives while Redis does not answer
                th.start()
            time.sleep(1.5)  # the pause itself: what is tested, not a wait for something
        for th in threads:
            th.join(60)
        assert not any(th.is_alive() for th in threads), "requests still running"

        answered = [r for r in results if r[1] == 200 and _completed(r[0], r[2])]
        refused = [r[2][:200] for r in results if r[1] != 200]
        assert len(answered) == 48, f"{len(answered)} of 48 answered; refused: {refused[:3]}"
        stats = stub.stats()
        assert stats["completed"] == 48 and stats["cancelled"] == 0
        assert stats["max_in_flight"] <= SLOTS  # no slot was handed out twice
        _nothing_left(redis_server, gws)
        for gw in gws:
            assert gw.admin(ADMIN)["cluster"]["reachable"] is True
            assert not [r for r in gw.access_log() if r.get("status") != 200]


# each dialect's overload answer to a new request while Redis is gone: path, body, status, and how
# its error names the cause
NEW_WORK = {
    "openai": ("/llm/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 429),
    "anthropic": ("/llm/v1/messages",
                  {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}, 529),
    "responses": ("/llm/v1/responses", {"model": "m", "input": "hi"}, 429),
    "gemini": ("/llm/v1beta/models/m:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
               429),
    "ollama": ("/api/chat", {"model": "m", "stream": False, "messages": [{"role": "user", "content": "hi"}]}, 503),
}


def _error_message(dialect: str, raw: bytes) -> str:
    doc = json.loads(raw)
    if dialect == "ollama":
        return doc["error"]
    return doc["error"]["message"]


def test_a_redis_silent_for_longer_than_a_lease_refuses_new_work_and_stops_running_work(stub, redis_server):
    lease_s = 4.0  # Redis counts as gone after 2 s without an answer; leases run out at 4 s
    stub.reset()
    with ExitStack() as stack:
        gws = _start(stack, stub, redis_server, lease_s, "ab")
        running: list = []
        threads = []
        for i in range(SLOTS):  # 40 s streams, two on each replica, one per dialect
            dialect = "openai" if i % 2 else "anthropic"

            def run(gw=gws[i // 2], dialect=dialect) -> None:
                status, _, raw = _stream(gw, 2000, dialect)
                running.append((dialect, status, raw))

            threads.append(threading.Thread(target=run, daemon=True))
            threads[-1].start()
        wait_for(lambda: len(redis_server.client().zrange("hlf:slots:b", 0, -1)) == SLOTS, timeout=30)
        wait_for(lambda: stub.stats()["in_flight"] == SLOTS, timeout=30)

        with _frozen(redis_server):
            for dialect, (path, body, status) in NEW_WORK.items():
                got, headers, raw = post_raw(gws[0].url + path, body, timeout=lease_s + 5)
                assert got == status, (dialect, raw[:300])
                assert int(headers["retry-after"]) >= 1
                assert "Redis" in _error_message(dialect, raw), (dialect, raw[:300])
            view = gws[0].admin(ADMIN)["cluster"]
            assert view["reachable"] is False and "no answer" in view["last_error"]

            # the running requests are stopped before their leases could run out, Redis still silent
            for th in threads:
                th.join(lease_s + 5)
            assert not any(th.is_alive() for th in threads), "running requests were not stopped"
            assert stub.stats()["cancelled"] == SLOTS
        for dialect, status, raw in running:
            assert status == 200 and not _completed(dialect, raw)  # streams: the error is in-band
            if dialect == "openai":
                assert b"lease" in raw.split(b"data: ")[-1]
            else:
                name, data = sse_events(raw)[-1]
                assert name == "error" and "lease" in data["error"]["message"]
        stopped = [r for gw in gws for r in gw.access_log() if r.get("outcome") == "error_overloaded"]
        assert len(stopped) == SLOTS

        # Redis answers again: the replicas take new work and nothing of the old is left
        wait_for(lambda: all(gw.admin(ADMIN)["cluster"]["reachable"] for gw in gws), timeout=lease_s + 5)
        for gw, dialect in zip(gws, ("openai", "anthropic")):
            status, _, raw = _stream(gw, 5, dialect)
            assert status == 200 and _completed(dialect, raw)
        _nothing_left(redis_server, gws)
        assert stub.stats()["max_in_flight"] <= SLOTS
