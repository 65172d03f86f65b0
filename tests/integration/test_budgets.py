"""Token budgets per key (`auth.keys[].budget`), on real gateway processes in front of a real
stub: the 429 in each dialect with Retry-After to the UTC window's reset, a running request never
cut, a restart keeping the count, and two replicas sharing one budget through a real
redis-server, where a burst crossing the budget overshoots by at most the requests already
admitted."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw
from redisproc import RedisServer, available
from stubproc import start_stub, wait_for

KEYS = {"GUEST_KEY": "sk-guest", "RUNNER_KEY": "sk-runner", "MONTHLY_KEY": "sk-monthly", "ADMIN_KEY": "sk-adm"}


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "m") as s:
        yield s


def _config(stub, tmp, **extra) -> dict:
    auth = {"keys": [
        {"name": "guest", "key_env": "GUEST_KEY", "budget": {"tokens_per_day": 100}},
        {"name": "runner", "key_env": "RUNNER_KEY", "budget": {"tokens_per_day": 60}},
        {"name": "monthly", "key_env": "MONTHLY_KEY", "budget": {"tokens_per_month": 30}},
    ], "admin_key_env": "ADMIN_KEY"}
    return config_for({"b": {"url": stub.base, "kind": "vllm", "slots": 8}}, {"m": {"backend": "b"}},
                      auth=auth, usage={"path": str(tmp / "usage.sqlite3")}, **extra)


def _chat(g: Gateway, key: str, prompt: str, stream: bool = False):
    return post_raw(g.url + "/llm/v1/chat/completions",
                    {"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]},
                    {"authorization": f"Bearer {key}"})


def _next_midnight(now: float) -> int:
    return (int(now) // 86400 + 1) * 86400


def _next_month(now: float) -> int:
    d = time.gmtime(now)
    y, m = (d.tm_year + 1, 1) if d.tm_mon == 12 else (d.tm_year, d.tm_mon + 1)
    return calendar.timegm((y, m, 1, 0, 0, 0))


def _used(g: Gateway, key: str) -> int:
    status, doc = g.get(f"/admin/usage?key={key}", {"authorization": "Bearer sk-adm"})
    assert status == 200
    return sum(r["input_tokens"] + r["output_tokens"] for r in doc["rows"])


def test_past_the_daily_budget_each_dialect_gets_a_429_until_midnight(stub, tmp_path):
    with Gateway(_config(stub, tmp_path), env=KEYS) as g:
        spent = []
        for _ in range(50):
            status, headers, raw = _chat(g, "sk-guest", "[stub content=10] spend")
            if status != 200:
                break
            spent.append(json.loads(raw)["usage"]["total_tokens"])
        assert status == 429, raw
        # refused right after crossing it: everything before fitted under 100
        assert sum(spent) >= 100 > sum(spent[:-1])
        now = time.time()
        assert abs(int(headers["retry-after"]) - (_next_midnight(now) - now)) <= 5
        err = json.loads(raw)["error"]
        assert err["type"] == "rate_limit_error" and "tokens_per_day" in err["message"] and "guest" in err["message"]
        # a streaming request past the budget: a plain 429, not a stream
        status, headers, raw = _chat(g, "sk-guest", "[stub content=10] stream", stream=True)
        assert status == 429 and headers["content-type"].startswith("application/json")
        assert "text/event-stream" not in headers["content-type"]
        # the Anthropic and Responses dialects, in their own error shapes
        status, headers, raw = post_raw(g.url + "/llm/v1/messages", {
            "model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            {"x-api-key": "sk-guest"})
        doc = json.loads(raw)
        assert status == 429 and doc["type"] == "error" and doc["error"]["type"] == "rate_limit_error"
        assert "retry-after" in headers
        status, headers, raw = post_raw(g.url + "/llm/v1/responses", {"model": "m", "input": "hi"},
                                        {"authorization": "Bearer sk-guest"})
        assert status == 429 and "tokens_per_day" in json.loads(raw)["error"]["message"]
        # the budget's use, as the admin and the dashboard see it
        status, doc = g.get("/admin/usage?key=guest", {"authorization": "Bearer sk-adm"})
        (b,) = doc["budgets"]
        assert b["exhausted"] and b["used_today"] == sum(spent) and b["tokens_per_day"] == 100
        refused = sum(r["refused"] for r in doc["rows"])
        assert refused == 4
        path = g.config_path
    with Gateway(_config(stub, tmp_path), env=KEYS) as again:  # a restart keeps the day's count
        assert again.config_path != path
        assert _chat(again, "sk-guest", "[stub content=10] after restart")[0] == 429


def test_a_running_request_is_never_cut_by_the_budget(stub, tmp_path):
    with Gateway(_config(stub, tmp_path), env=KEYS) as g:
        long_one: dict = {}

        def run() -> None:
            long_one["got"] = _chat(g, "sk-runner", "[stub content=80 delay_ms=25] long", stream=True)

        th = threading.Thread(target=run)
        th.start()
        wait_for(lambda: any(r["key"] == "runner" for r in g.admin({"authorization": "Bearer sk-adm"})["requests"]), 10)
        status, _, _ = _chat(g, "sk-runner", "[stub content=60] over")  # finishes first: over 60
        assert status == 200
        status, _, raw = _chat(g, "sk-runner", "[stub content=5] refused")
        assert status == 429, raw
        th.join(30)
        status, _, body = long_one["got"]
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]")  # ran to its end
        assert body.count(b'"content":"') >= 80


def test_past_the_monthly_budget_retry_after_is_the_months_end(stub, tmp_path):
    with Gateway(_config(stub, tmp_path), env=KEYS) as g:
        assert _chat(g, "sk-monthly", "[stub content=40] one")[0] == 200
        status, headers, raw = _chat(g, "sk-monthly", "[stub content=1] two")
        now = time.time()
        assert status == 429
        assert abs(int(headers["retry-after"]) - (_next_month(now) - now)) <= 5  # not capped at a day
        assert "tokens_per_month" in json.loads(raw)["error"]["message"]
        # a reload that raises the budget lets the key in again, its count kept
        cfg = _config(stub, tmp_path)
        cfg["auth"]["keys"][2]["budget"] = {"tokens_per_month": 100000}
        g.write_config(cfg)
        assert g.post("/admin/reload", headers={"authorization": "Bearer sk-adm"})[0] == 200
        assert _chat(g, "sk-monthly", "[stub content=1] three")[0] == 200
        status, doc = g.get("/admin/usage?key=monthly", {"authorization": "Bearer sk-adm"})
        assert doc["budgets"][0]["tokens_per_month"] == 100000 and doc["budgets"][0]["used_this_month"] > 40


@pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")
def test_two_replicas_share_one_budget_and_a_burst_overshoots_by_the_admitted_only(tmp_path):
    budget, workers = 400, 4
    with ExitStack() as stack:
        slow = stack.enter_context(start_stub("vllm", "--model", "m", "--token-delay-ms", "10"))
        redis = stack.enter_context(RedisServer())
        auth = {"keys": [{"name": "team", "key_env": "TEAM_KEY", "budget": {"tokens_per_day": budget}}],
                "admin_key_env": "ADMIN_KEY"}
        env = {"TEAM_KEY": "sk-team", "ADMIN_KEY": "sk-adm"}

        def cfg(replica: str) -> dict:
            return config_for({"b": {"url": slow.base, "kind": "vllm", "slots": 8}}, {"m": {"backend": "b"}},
                              auth=auth, cluster={"redis_url": redis.url, "replica_id": replica},
                              usage={"path": str(tmp_path / f"{replica}.sqlite3")})

        with ThreadPoolExecutor(2) as pool:
            a, b = (stack.enter_context(f.result()) for f in [pool.submit(Gateway, cfg("a"), env),
                                                               pool.submit(Gateway, cfg("b"), env)])
        # what one request costs (input + output, the stub is deterministic)
        status, _, raw = _chat(a, "sk-team", "[stub content=20] burst")
        assert status == 200
        cost = json.loads(raw)["usage"]["total_tokens"]
        results: list[int] = []
        lock = threading.Lock()
        stop = threading.Event()

        def worker(i: int) -> None:
            g = (a, b)[i % 2]
            while not stop.is_set():
                status, _, _ = _chat(g, "sk-team", "[stub content=20] burst")
                with lock:
                    results.append(status)
                if status == 429:
                    return

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        stop.set()
        ok = 1 + results.count(200)
        assert results.count(429) == workers  # every worker, on either replica, was refused in the end
        crossing = -(-budget // cost)  # the request that took the count past the budget
        print(f"\nbudget {budget}, {cost} tokens a request: {ok} answered (the {crossing}th crossed it), "
              f"{results.count(429)} refused")
        # the overshoot: only the requests admitted before the crossing one finished
        assert crossing <= ok <= crossing + workers - 1, (ok, cost, results)
        # the shared ledger and counts agree from either replica
        wait_for(lambda: _used(a, "team") == _used(b, "team") == ok * cost, 10)
        # and `homelab-frontend usage` reads the same rows from Redis, no gateway asked
        out = subprocess.run([sys.executable, "-m", "homelab_frontend", "usage", "--config", a.config_path, "--json"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout)["rows"]
        assert row["key"] == "team" and row["requests"] == ok + results.count(429)
        assert row["input_tokens"] + row["output_tokens"] == ok * cost
        # after the burst: either replica refuses at once, with the reset at UTC midnight
        for g in (a, b):
            status, headers, _ = _chat(g, "sk-team", "[stub content=1] again")
            now = time.time()
            assert status == 429 and abs(int(headers["retry-after"]) - (_next_midnight(now) - now)) <= 5
