"""Slots, the bounded queue, timeouts and operator cancels, with real processes."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw, sse_events
from stubproc import start_stub, wait_for


@pytest.fixture(scope="module")
def slow_stub():
    with start_stub("vllm", "--model", "m", "--token-delay-ms", "20") as s:
        yield s


def _gw(stub, slots=2, depth=32, timeout_s=60.0, **timeouts):
    backend = {"url": stub.base, "slots": slots, "queue": {"depth": depth, "timeout_s": timeout_s}}
    if timeouts:
        backend["timeouts"] = timeouts
    return Gateway(config_for({"b": backend}, {"m": {"backend": "b"}}))


def _openai(gw, prompt, stream=True):
    return post_raw(gw.base + "/chat/completions", {"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]})


def _anthropic(gw, prompt, stream=True):
    return post_raw(gw.base + "/messages", {"model": "m", "stream": stream, "max_tokens": 512,
                                            "messages": [{"role": "user", "content": prompt}]})


def _responses(gw, prompt, stream=True):
    return post_raw(gw.base + "/responses", {"model": "m", "stream": stream, "store": False, "input": prompt})


def _gemini(gw, prompt, stream=True):
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return post_raw(gw.llm + f"/v1beta/models/m:{method}", {"contents": [{"parts": [{"text": prompt}]}]})


def test_never_more_in_flight_than_slots_and_all_complete(slow_stub):
    slow_stub.reset()
    with _gw(slow_stub, slots=2) as gw:
        calls = [(_openai if i % 2 else _anthropic) for i in range(6)]
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda f: f(gw, "[stub content=15]"), calls))
        assert all(status == 200 for status, _, _ in results)
        for (status, _, raw), f in zip(results, calls):
            assert (b"[DONE]" in raw) if f is _openai else raw.rstrip().endswith(b'{"type":"message_stop"}')
        stats = slow_stub.stats()
        assert stats["max_in_flight"] == 2 and stats["completed"] == 6
        backend = gw.admin()["backends"]["b"]
        assert (backend["in_use"], backend["queued"]) == (0, 0)
        waits = [r["queue_wait_ms"] for r in gw.access_log() if r["status"] == 200]
        # the queue was used: with six at once on two slots someone waits; how long, and how many,
        # is how far apart a busy machine's threads arrive (one run saw one wait past 100 ms, not two)
        assert sum(1 for w in waits if w and w > 0) >= 1


def test_full_queue_is_refused_in_each_dialect_with_retry_after(slow_stub):
    with _gw(slow_stub, slots=1, depth=1) as gw:
        hold = threading.Thread(target=_openai, args=(gw, "[stub content=100]"))
        queued = threading.Thread(target=_openai, args=(gw, "[stub content=1]"))
        hold.start()
        wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 1, 5)
        queued.start()
        wait_for(lambda: gw.admin()["backends"]["b"]["queued"] == 1, 5)
        status, hdrs, raw = _openai(gw, "hi")
        assert status == 429 and int(hdrs["retry-after"]) >= 1
        err = json.loads(raw)["error"]
        assert err["type"] == "rate_limit_error" and "queue" in err["message"]
        status, hdrs, raw = _anthropic(gw, "hi")
        assert status == 529 and int(hdrs["retry-after"]) >= 1
        assert json.loads(raw)["error"]["type"] == "overloaded_error"
        status, hdrs, raw = _responses(gw, "hi")
        assert status == 429 and int(hdrs["retry-after"]) >= 1
        err = json.loads(raw)["error"]
        # the sentence Codex reads its retry delay from
        assert err["type"] == "rate_limit_error" and f"try again in {hdrs['retry-after']}s" in err["message"]
        hold.join()
        queued.join()
        assert gw.admin()["backends"]["b"]["in_use"] == 0


def test_queue_timeout(slow_stub):
    with _gw(slow_stub, slots=1, timeout_s=0.3) as gw:
        hold = threading.Thread(target=_openai, args=(gw, "[stub content=60]"))
        hold.start()
        wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 1, 5)
        t0 = time.monotonic()
        status, hdrs, raw = _anthropic(gw, "hi")
        assert status == 529 and 0.25 < time.monotonic() - t0 < 2
        assert "0.3 s" in json.loads(raw)["error"]["message"] and hdrs["retry-after"]
        hold.join()


def test_cancel_while_queued_leaves_the_queue(slow_stub):
    slow_stub.reset()
    with _gw(slow_stub, slots=1) as gw:
        # the hold outlasts the three vanishings (a 1 s hold did not: the last one got the slot)
        hold = threading.Thread(target=_openai, args=(gw, "[stub content=300]"))
        hold.start()
        wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 1, 5)
        for path, body in (("/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}),
                           ("/messages", {"model": "m", "stream": True, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}),
                           ("/responses", {"model": "m", "stream": True, "input": "x"})):
            post_and_vanish(gw.base + path, body, after_s=0.3,
                            when=lambda: gw.admin()["backends"]["b"]["queued"] == 1)  # it is queued
            wait_for(lambda: gw.admin()["backends"]["b"]["queued"] == 0, 5)
        hold.join()
        assert slow_stub.stats()["total"] == 1  # the vanished ones never reached the backend
        outcomes = [r["outcome"] for r in gw.access_log()]
        assert outcomes.count("cancelled_queued") == 3


@pytest.fixture(scope="module")
def first_token_gw(slow_stub):
    """One gateway for the four dialects' first-token timeouts: each test ends with its slots free."""
    with _gw(slow_stub, first_token_s=0.4) as gw:
        yield gw


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses", "gemini"])
def test_first_token_timeout(first_token_gw, dialect):
    call = {"openai": _openai, "anthropic": _anthropic, "responses": _responses, "gemini": _gemini}[dialect]
    gw = first_token_gw
    # upstream headers never come: a clean HTTP error in the dialect
    status, _, raw = call(gw, "[stub headers_ms=3000]")
    assert status == 504
    assert "first token" in raw.decode()
    # headers came, the first token did not: the stream has started, so an error in-stream
    status, _, raw = call(gw, "[stub ttft_ms=3000]")
    assert status == 200 and b"first token" in raw
    if dialect == "responses":
        assert b"event: response.failed" in raw and b"response.completed" not in raw
    elif dialect == "gemini":  # the error line outside the SSE framing, no finishReason
        assert json.loads(raw.split(b"\r\n\r\n")[-1])["error"]["status"] == "DEADLINE_EXCEEDED"
        assert b"finishReason" not in raw
    else:
        assert (b"[DONE]" not in raw) if dialect == "openai" else (b"message_stop" not in raw and b"event: error" in raw)
    wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 0, 2)


def test_idle_timeout_midstream(slow_stub):
    with _gw(slow_stub, first_token_s=5, idle_s=0.4) as gw:
        status, _, raw = _anthropic(gw, "[stub content=5 first_ms=0 delay_ms=1500]")
        events = sse_events(raw)
        assert events[-1][0] == "error" and "silent" in events[-1][1]["error"]["message"]
        assert events[-1][1]["error"]["type"] == "timeout_error"
        wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 0, 2)


def test_total_timeout_stream_and_nonstream(slow_stub):
    with _gw(slow_stub, total_s=0.5) as gw:
        status, _, raw = _openai(gw, "[stub content=200]")
        assert status == 200 and b"[DONE]" not in raw and b"0.5 s" in raw
        status, _, raw = _openai(gw, "[stub content=200]", stream=False)
        assert status == 504 and json.loads(raw)["error"]["type"]
        status, _, raw = _anthropic(gw, "[stub content=200]", stream=False)
        assert status == 504 and json.loads(raw)["type"] == "error"
        wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 0, 2)


def test_admin_cancel(slow_stub):
    slow_stub.reset()
    with _gw(slow_stub) as gw:
        result = {}
        th = threading.Thread(target=lambda: result.setdefault("r", _anthropic(gw, "[stub content=300]")))
        th.start()
        running = wait_for(lambda: [r for r in gw.admin()["requests"] if r["phase"] == "streaming"], 5)
        rec = running[0]
        assert rec["dialect"] == "anthropic" and rec["model"] == "m" and rec["backend"] == "b"
        assert rec["tokens_out"] >= 0 and rec["age_s"] >= 0
        status, doc = gw.post(f"/admin/requests/{rec['id']}/cancel")
        assert status == 200
        th.join(5)
        status, _, raw = result["r"]
        names = [n for n, _ in sse_events(raw)]
        assert names[-1] == "error" and "message_stop" not in names
        wait_for(lambda: slow_stub.stats()["in_flight"] == 0, 1)
        assert slow_stub.stats()["cancelled"] == 1
        assert gw.post("/admin/requests/req_nope/cancel")[0] == 404


def test_model_on_several_backends_goes_to_the_most_free_slots():
    with start_stub("vllm", "--model", "m") as a, start_stub("ollama", "--model", "m") as b:
        cfg = config_for({"a": {"url": a.base, "slots": 3}, "b": {"url": b.base, "slots": 1, "kind": "ollama"}},
                         {"m": {"backends": ["a", "b"]}})
        with Gateway(cfg) as gw:
            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(lambda _: _openai(gw, "[stub content=40 delay_ms=20]"), range(4)))
            assert all(status == 200 for status, _, _ in results)
            assert a.stats()["max_in_flight"] == 3 and b.stats()["max_in_flight"] == 1


def test_connect_timeout_on_a_backend_that_never_accepts():
    """A listener whose accept queue is full drops new SYNs (Linux), so connecting hangs: the
    loopback way to meet `connect_s` without sending traffic anywhere else."""
    import socket

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue; never accepted
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fillers.append(f)
        time.sleep(0.2)
        backend = {"url": f"http://127.0.0.1:{port}/v1", "timeouts": {"connect_s": 0.5}, "health_interval_s": 60}
        with Gateway(config_for({"b": backend}, {"m": {"backend": "b"}})) as gw:
            t0 = time.monotonic()
            status, _, raw = _openai(gw, "hi", stream=False)
            took = time.monotonic() - t0
            assert status in (502, 503), raw
            assert "no connection within 0.5 s" in json.loads(raw)["error"]["message"]
            assert took < 5
            assert gw.admin()["backends"]["b"]["in_use"] == 0
    finally:
        for f in fillers:
            f.close()
        lsock.close()
