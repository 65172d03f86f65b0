"""`on_client_gone: drain` (request/drain.py) through a real gateway in front of the vLLM stub:
a client that leaves mid-stream, mid-whole-answer or by the operator's cancel is let go at once,
the upstream generation runs to its end (the stub's own log says `completed`, never `cancelled`),
its slot stays held until then (the gateway's /admin figure, polled; a request sent meanwhile
waits for it), then is freed; the access log says the client cancelled and the upstream
completed, with the backend's own token counts."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish
from stubproc import start_stub, wait_for

BODY = {"model": "m", "stream": True, "max_tokens": 64,
        "messages": [{"role": "user", "content": "go [stub content=40 delay_ms=50]"}]}


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "m") as s:
        yield s


@pytest.fixture(scope="module")
def gw(stub):
    cfg = config_for({"gpu0": {"url": stub.base, "kind": "vllm", "slots": 1, "on_client_gone": "drain"}},
                     {"m": {"backend": "gpu0"}}, auth={"admin_key_env": "HLF_TEST_ADMIN"})
    with Gateway(cfg, env={"HLF_TEST_ADMIN": "adm"}) as g:
        yield g


ADMIN = {"authorization": "Bearer adm"}


def _in_use(gw) -> int:
    return gw.admin(ADMIN)["backends"]["gpu0"]["in_use"]


def _usage(gw) -> dict:
    status, doc = gw.get("/admin/usage?model=m", ADMIN)
    assert status == 200, doc
    out: dict = {}
    for row in doc["rows"]:
        for k, v in row.items():
            if isinstance(v, (int, float)) and k != "start_unix":
                out[k] = out.get(k, 0) + v
    return out


def _completed(stub) -> int:
    return stub.log_text().count("completed id=")


def test_a_client_leaving_mid_stream_is_let_go_and_the_generation_finishes_with_its_slot_held(gw, stub):
    stub.reset()
    skip = len(stub.log_lines())
    done_before, cancelled_before = _completed(stub), stub.log_text().count("cancelled")
    t0 = time.monotonic()
    post_and_vanish(gw.base + "/chat/completions", BODY, after_bytes=800)  # a few tokens, then gone
    left = time.monotonic()
    # the client was let go at once; the upstream is still generating, on the slot it holds
    assert _in_use(gw) == 1 and _completed(stub) == done_before
    live = gw.admin(ADMIN)["requests"]
    assert len(live) == 1 and live[0]["phase"] == "draining", live
    # a request sent now waits for that slot
    second: dict = {}

    def send() -> None:
        req = urllib.request.Request(gw.base + "/chat/completions", method="POST",
                                     data=json.dumps({**BODY, "stream": False, "messages": [
                                         {"role": "user", "content": "next [stub content=2]"}]}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            second["status"] = resp.status
            second["at"] = time.monotonic()

    th = threading.Thread(target=send)
    th.start()
    wait_for(lambda: _completed(stub) >= done_before + 1, 15, 0.02)
    th.join(30)
    assert second.get("status") == 200
    # the stub's own log: the first generation ran to its end, none was cancelled, and the second
    # reached the stub only after the first had completed
    log = stub.log_lines()[skip:]
    assert stub.log_text().count("cancelled") == cancelled_before, log
    first_done = next(i for i, ln in enumerate(log) if ln.startswith("completed id="))
    second_in = [i for i, ln in enumerate(log) if ln.startswith("request id=")][1]
    assert second_in > first_done, log
    assert left - t0 < 2.0  # 40 tokens at 50 ms: the client did not wait for them
    wait_for(lambda: _in_use(gw) == 0, 5, 0.02)
    rec = wait_for(lambda: [r for r in gw.access_log() if r.get("drained")], 5)
    assert rec[0]["outcome"] == "cancelled_streaming" and rec[0]["status"] == 499
    assert rec[0]["drained"] == "completed" and rec[0]["tokens_out"] == 40, rec[0]  # the backend's own count
    assert gw.admin(ADMIN)["requests"] == []
    # the ledger: one cancelled request with the whole generation's tokens, exact (the second: ok)
    usage = wait_for(lambda: (u := _usage(gw)).get("requests") == 2 and u, 10)
    assert usage["cancelled"] == 1 and usage["ok"] == 1 and usage["output_tokens"] == 42, usage
    assert usage["estimated_output"] == 0, usage


def test_a_whole_answer_whose_client_left_is_drained_too(gw, stub):
    stub.reset()
    before, arrived = _completed(stub), stub.log_text().count("request id=")
    post_and_vanish(gw.base + "/chat/completions", {**BODY, "stream": False},
                    when=lambda: stub.log_text().count("request id=") > arrived, after_s=0.3)
    assert _in_use(gw) == 1
    wait_for(lambda: _completed(stub) == before + 1, 15, 0.02)
    wait_for(lambda: _in_use(gw) == 0, 5, 0.02)
    assert "cancelled" not in stub.log_text()


def test_the_operators_cancel_releases_the_client_and_drains_the_backend(gw, stub):
    stub.reset()
    before = _completed(stub)
    got: dict = {}

    def stream() -> None:
        req = urllib.request.Request(gw.base + "/chat/completions", method="POST", data=json.dumps(BODY).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            got["body"] = resp.read()
            got["at"] = time.monotonic()

    th = threading.Thread(target=stream)
    th.start()
    rid = wait_for(lambda: [r["id"] for r in gw.admin(ADMIN)["requests"] if r["phase"] == "streaming"], 10)[0]
    status, _ = gw.post(f"/admin/requests/{rid}/cancel", {}, ADMIN)
    assert status in (200, 202)
    th.join(30)
    assert b"cancelled by the gateway's operator" in got["body"]  # the client got its error at once
    assert _in_use(gw) == 1 and _completed(stub) == before
    wait_for(lambda: _completed(stub) == before + 1, 15, 0.02)
    wait_for(lambda: _in_use(gw) == 0, 5, 0.02)
    assert "cancelled" not in stub.log_text()


def test_a_drain_is_bounded_by_the_backends_idle_timeout(stub):
    """A backend that goes silent while drained gets its connection closed after `idle_s` (the
    stub then logs the cancel), and the slot comes back."""
    cfg = config_for({"gpu0": {"url": stub.base, "kind": "vllm", "slots": 1, "on_client_gone": "drain",
                               "timeouts": {"idle_s": 1}}},
                     {"m": {"backend": "gpu0"}}, auth={"admin_key_env": "HLF_TEST_ADMIN"})
    with Gateway(cfg, env={"HLF_TEST_ADMIN": "adm"}) as g:
        cancelled = stub.log_text().count("cancelled id=")
        post_and_vanish(g.base + "/chat/completions",
                        {**BODY, "messages": [{"role": "user", "content": "go [stub content=5 delay_ms=3000]"}]},
                        until=b'"content":"Hello')
        assert _in_use(g) == 1
        wait_for(lambda: stub.log_text().count("cancelled id=") == cancelled + 1, 10, 0.05)
        wait_for(lambda: _in_use(g) == 0, 5, 0.02)
        rec = wait_for(lambda: [r for r in g.access_log() if r.get("drained")], 5)
        assert rec[0]["drained"] == "cut" and rec[0]["outcome"].startswith("cancelled_")
