"""The usage ledger against the upstream's own figures: a real gateway in front of a real stub
process, every dialect, streaming and not, finished, cancelled and failed requests; the client
and admin endpoints; `homelab-frontend usage` reading the file with no gateway running; and the
ledger surviving `kill -9`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import start_stub, wait_for

ALICE, BOB, ADMIN = "sk-alice-usage", "sk-bob-usage", "sk-admin-usage"
ENV = {"ALICE_KEY": ALICE, "BOB_KEY": BOB, "ADMIN_KEY": ADMIN}
AUTH = {"keys": [{"name": "alice", "key_env": "ALICE_KEY"}, {"name": "bob", "key_env": "BOB_KEY"}],
        "admin_key_env": "ADMIN_KEY"}


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "up-m") as s:
        yield s


@pytest.fixture(scope="module")
def gw(stub):
    cfg = config_for({"b": {"url": stub.base, "kind": "vllm", "slots": 4}},
                     {"m": {"backend": "b", "upstream_model": "up-m"}}, auth=AUTH)
    with Gateway(cfg, env=ENV) as g:
        yield g


def _body(dialect: str, prompt: str, stream: bool) -> tuple[str, dict]:
    if dialect == "openai":
        return "/llm/v1/chat/completions", {"model": "m", "stream": stream,
                                            "messages": [{"role": "user", "content": prompt}]}
    if dialect == "responses":
        return "/llm/v1/responses", {"model": "m", "stream": stream, "input": prompt, "store": False}
    return "/llm/v1/messages", {"model": "m", "stream": stream, "max_tokens": 512,
                                "messages": [{"role": "user", "content": prompt}]}


def _auth(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def usage_totals(g: Gateway, key: str, model: str = "m") -> dict:
    status, doc = g.get(f"/admin/usage?key={key}&model={model}", _auth(ADMIN))
    assert status == 200, doc
    out: dict = {}
    for row in doc["rows"]:
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "start_unix":
                out[k] = out.get(k, 0) + v
    return out


def _delta(after: dict, before: dict) -> dict:
    return {k: round(after.get(k, 0) - before.get(k, 0), 6) for k in after}


def _settled(g: Gateway, key: str, before: dict, n: int = 1) -> dict:
    """The ledger's change once `n` more requests are in it."""
    return wait_for(lambda: (d := _delta(usage_totals(g, key), before)).get("requests", 0) >= n and d, 10)


def _stub_line(stub, before: int, pattern: str) -> re.Match:
    return wait_for(lambda: next((m for line in stub.log_lines()[before:] if (m := re.search(pattern, line))), None), 10)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_finished_request_matches_the_upstreams_usage(gw, stub, dialect, stream):
    before, lines, prompt_before = usage_totals(gw, "alice"), len(stub.log_lines()), stub.stats()["prompt_tokens"]
    path, body = _body(dialect, f"[stub content=7] usage {dialect} {stream}", stream)
    status, _, raw = post_raw(gw.url + path, body, _auth(ALICE))
    assert status == 200, raw
    done = _stub_line(stub, lines, r"completed id=\S+ tokens=(\d+)")
    d = _settled(gw, "alice", before)
    assert d["requests"] == 1 and d["ok"] == 1
    assert d["output_tokens"] == int(done.group(1)) == 7  # the stub's own count of what it generated
    assert d["input_tokens"] == stub.stats()["prompt_tokens"] - prompt_before > 0  # what it was prompted with
    assert d["estimated_input"] == d["estimated_output"] == 0  # the upstream reported both
    assert d["slot_seconds"] > 0


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_cancelled_stream_counts_what_was_generated_before_the_stop(gw, stub, dialect):
    before, lines, prompt_before = usage_totals(gw, "alice"), len(stub.log_lines()), stub.stats()["prompt_tokens"]
    path, body = _body(dialect, "[stub content=400 delay_ms=15] cancel me", True)
    got = post_and_vanish(gw.url + path, body, after_bytes=1500, headers=_auth(ALICE))
    assert got.startswith(b"HTTP/1.1 200")
    stopped = _stub_line(stub, lines, r"cancelled id=\S+ after (\d+) tokens")
    d = _settled(gw, "alice", before)
    assert d["cancelled"] == 1
    # what the gateway read before it cut the stream: no more than the stub had sent, and some
    assert 1 <= d["output_tokens"] <= int(stopped.group(1)) < 400
    if dialect in ("anthropic", "responses"):
        # the translating surfaces ask vLLM for usage on every chunk (surfaces/skeleton.py): the
        # upstream's own figures as of the stop, exact
        assert d["estimated_output"] == d["estimated_input"] == 0
        assert d["input_tokens"] == stub.stats()["prompt_tokens"] - prompt_before
    else:  # no usage before the end: the gateway's own count, and the prompt estimated
        assert d["estimated_output"] == d["estimated_input"] == 1
        assert d["input_tokens"] > 0


@pytest.mark.parametrize("how", ["fail_after", "error_after"], ids=["connection_dropped", "error_frame"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_failed_stream_counts_the_tokens_before_the_failure(gw, stub, dialect, how):
    before, lines = usage_totals(gw, "alice"), len(stub.log_lines())
    path, body = _body(dialect, f"[stub content=20 {how}=5] fail me", True)
    post_raw(gw.url + path, body, _auth(ALICE))
    failed = _stub_line(stub, lines, r"(?:aborted|failed) id=\S+ after (\d+) tokens")
    d = _settled(gw, "alice", before)
    assert d["failed"] == 1
    assert d["output_tokens"] == int(failed.group(1)) == 5


def test_an_upstream_refusal_counts_nothing(gw, stub):
    before = usage_totals(gw, "alice")
    path, body = _body("openai", "[stub status=503] refuse", False)
    status, _, _ = post_raw(gw.url + path, body, _auth(ALICE))
    assert status == 503
    d = _settled(gw, "alice", before)
    assert d["failed"] == 1 and d["input_tokens"] == d["output_tokens"] == 0


def test_a_client_key_sees_only_its_own_rows(gw):
    path, body = _body("openai", "[stub content=3] bob's", False)
    assert post_raw(gw.url + path, body, _auth(BOB))[0] == 200
    wait_for(lambda: usage_totals(gw, "bob").get("requests"), 10)
    status, doc = gw.get("/llm/v1/usage?by=day", _auth(BOB))
    assert status == 200 and doc["rows"] and {r["key"] for r in doc["rows"]} == {"bob"}
    row = doc["rows"][0]
    assert row["model"] == "m" and row["start"].endswith("T00:00:00Z") and row["start_unix"] % 86400 == 0
    assert {"requests", "input_tokens", "cached_tokens", "output_tokens", "slot_seconds"} <= row.keys()
    status, doc = gw.get("/llm/v1/usage?key=alice", _auth(BOB))
    assert status == 403 and doc["error"]["type"] == "permission_error" and doc["error"]["param"] == "key"
    assert gw.get("/llm/v1/usage")[0] == 401
    assert gw.get("/admin/usage", _auth(BOB))[0] == 401  # a client key is not the admin key
    status, doc = gw.get("/admin/usage?since=yesterday", _auth(ADMIN))
    assert status == 400 and "since" in doc["error"]["message"]
    # hour rows are aligned to the UTC hour; since/until in ISO 8601 and Unix seconds agree
    now = int(time.time())
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600))
    a = gw.get(f"/admin/usage?since={iso}&key=bob", _auth(ADMIN))[1]
    b = gw.get(f"/admin/usage?since={now - 3600}&until={now + 3600}&key=bob", _auth(ADMIN))[1]
    assert a["rows"] == b["rows"] and all(r["start_unix"] % 3600 == 0 for r in a["rows"])


def test_the_cli_prints_the_table_without_a_gateway(gw):
    before = usage_totals(gw, "alice")
    path, body = _body("openai", "[stub content=4] for the table", False)
    assert post_raw(gw.url + path, body, _auth(ALICE))[0] == 200
    _settled(gw, "alice", before)
    cmd = [sys.executable, "-m", "homelab_frontend", "usage", "--config", gw.config_path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **ENV})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["key", "model", "requests", "input", "cached", "output"]
    alice = next(line.split() for line in lines if line.startswith("alice"))
    totals = usage_totals(gw, "alice")
    assert alice[:3] == ["alice", "m", str(totals["requests"])]
    assert alice[3] == str(totals["input_tokens"]) and alice[5] == str(totals["output_tokens"])
    out = subprocess.run(cmd + ["--json", "--by", "day"], capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout)["rows"]
    assert any(r["key"] == "alice" and r["start"].endswith("T00:00:00Z") for r in rows)


def test_the_ledger_survives_kill_9(stub, tmp_path):
    """Requests run one after another; the gateway is killed mid-run; after the restart the
    ledger holds every request that finished more than a second before the kill."""
    cfg = config_for({"b": {"url": stub.base, "kind": "vllm", "slots": 4}},
                     {"m": {"backend": "b", "upstream_model": "up-m"}}, usage={"path": str(tmp_path / "usage.sqlite3")})
    finished: list[float] = []
    g = Gateway(cfg)
    stop = threading.Event()

    def run() -> None:
        path, body = _body("openai", "[stub content=3 delay_ms=10] durable", False)
        while not stop.is_set():
            try:
                status, _, _ = post_raw(g.url + path, body, timeout=10)
            except (OSError, ValueError, IndexError):  # the gateway died under this one
                return
            if status == 200:
                finished.append(time.monotonic())

    workers = [threading.Thread(target=run) for _ in range(3)]
    try:
        for w in workers:
            w.start()
        # a few seconds of requests finishing all along, then the kill
        wait_for(lambda: len(finished) >= 30 and finished[-1] - finished[0] > 3, 60)
        killed_at = time.monotonic()
        g.proc.kill()  # SIGKILL: no shutdown, no last flush
        g.proc.wait()
        stop.set()
        for w in workers:
            w.join(15)
    finally:
        stop.set()
        g.stop()
    must_have = sum(1 for f in finished if f < killed_at - 1.0)
    with Gateway(cfg) as again:
        status, doc = again.get("/admin/usage")
        assert status == 200
        got = sum(r["requests"] for r in doc["rows"])
        print(f"\nkill -9: {len(finished)} answered, {must_have} more than 1 s before the kill, {got} in the ledger after the restart")
        assert must_have <= got <= len(finished) + 3  # +3: answered while the kill landed
        assert must_have > 0
