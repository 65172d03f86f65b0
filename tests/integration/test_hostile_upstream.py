"""A real gateway in front of a fault-injecting upstream (tests/hostile_upstream.py): hangs, huge
lines, bodies without an end, invalid JSON, odd shapes, HTML, gzip, resets, redirects, SIGSTOP,
in both dialects, streaming and not. The gateway stays alive with bounded memory, holds nothing
afterwards (no slot, no request), and every failure reaches the client in its dialect's shape."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw, sse_data, sse_events
from stubproc import wait_for
from support.hostile import Hostile

MiB = 1024 * 1024

FAULTS = ["hang-headers", "hang-body", "huge-line", "huge-body", "huge-length", "invalid-json", "choices-null",
          "message-str", "finish-int", "html", "html-502", "gzip", "reset", "redirect", "empty", "retry-429",
          "retry-503-date", "spaced", "good"]

EMBEDDING_FAULTS = ["embed-short", "embed-strings"]
OTHER_FAULTS = ["interleaved", "think-merged", "slow-eof"]


def _config(base: str, **backend) -> dict:
    b = {"url": base, "slots": 2, "kind": "openai", "health_interval_s": 30,
         "timeouts": {"connect_s": 2, "first_token_s": 1.5, "idle_s": 1, "nonstream_s": 1.5}, **backend}
    models = {f"c-{f}": {"backend": "h", "upstream_model": f} for f in FAULTS + EMBEDDING_FAULTS + OTHER_FAULTS}
    return config_for({"h": b}, models, anthropic={"ping_interval_s": 30})


@pytest.fixture(scope="module")
def hostile():
    h = Hostile()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def gw(hostile):
    with Gateway(_config(hostile.base)) as g:
        yield g


def _ask(gw: Gateway, dialect: str, fault: str, stream: bool) -> tuple[int, dict, bytes]:
    body = {"model": f"c-{fault}", "stream": stream, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    path = "/llm/v1/chat/completions" if dialect == "openai" else "/llm/v1/messages"
    return post_raw(gw.url + path, body, timeout=30)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _openai_error(doc: dict) -> dict:
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    return err


def _anthropic_error(doc: dict) -> dict:
    assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}
    return doc["error"]


# what each fault must look like to the client: (status, OpenAI code or None, Anthropic type or None)
EXPECTED = {
    "hang-headers": (504, "timeout", "timeout_error"),
    "hang-body": (504, "timeout", "timeout_error"),
    "huge-line": (502, "upstream_too_large", "api_error"),
    "huge-body": (502, "upstream_too_large", "api_error"),
    "huge-length": (502, "upstream_too_large", "api_error"),
    "invalid-json": (502, "upstream_malformed", "api_error"),
    "choices-null": (502, "upstream_malformed", "api_error"),
    "message-str": (502, "upstream_malformed", "api_error"),
    "finish-int": (502, "upstream_malformed", "api_error"),
    "html": (502, "upstream_malformed", "api_error"),
    "html-502": (502, "upstream_error", "api_error"),
    "gzip": (502, "upstream_malformed", "api_error"),
    "reset": (502, "upstream_error", "api_error"),
    "redirect": (502, "upstream_error", "api_error"),
    "empty": (502, "upstream_malformed", "api_error"),
    "retry-429": (429, "upstream_rate_limited", "rate_limit_error"),
    "retry-503-date": (503, "upstream_overloaded", "overloaded_error"),
}
# faults that show up only after a streamed answer started (the headers were a 200)
MIDSTREAM = {"hang-body", "huge-line", "huge-body", "huge-length", "invalid-json", "choices-null", "message-str",
             "finish-int", "html", "gzip", "reset", "empty"}


def _check_failure(dialect: str, fault: str, stream: bool, status: int, headers: dict, raw: bytes) -> None:
    exp_status, oai_code, ant_type = EXPECTED[fault]
    text = raw.decode(errors="replace")
    assert "Traceback" not in text and "127.0.0.1" not in text and "hostile" not in text
    if stream and fault in MIDSTREAM:
        assert status == 200
        if dialect == "openai":
            frames = sse_data(raw)
            last = json.loads(frames[-1])
            err = _openai_error(last)
            assert b"[DONE]" not in frames
        else:
            events = sse_events(raw)
            name, last = events[-1]
            assert name == "error" and "message_stop" not in [e for e, _ in events]
            err = _anthropic_error(last)
        assert err["message"]
        return
    if stream and fault == "hang-body" or (not stream and fault == "hang-body"):
        exp_status = 504
    assert status == exp_status, (fault, status, text)
    doc = json.loads(raw)
    if dialect == "openai":
        err = _openai_error(doc)
        assert err["code"] == oai_code, (fault, err)
    else:
        err = _anthropic_error(doc)
        assert err["type"] == ant_type, (fault, err)
    if fault == "retry-429":
        assert headers["retry-after"] == "7"
    if fault == "retry-503-date":
        assert 25 <= int(headers["retry-after"]) <= 31


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_every_fault_ends_in_the_dialects_shape_and_nothing_is_held(gw, hostile, dialect, stream):
    for fault in EXPECTED:
        status, headers, raw = _ask(gw, dialect, fault, stream)
        _check_failure(dialect, fault, stream, status, headers, raw)
    # the answers that are fine still are, with the client's model name and nothing internal
    for fault in ("good", "spaced"):
        status, headers, raw = _ask(gw, dialect, fault, stream)
        assert status == 200, raw
        assert b"secret" not in raw and b"gguf" not in raw
        if dialect == "openai":
            docs = [json.loads(f) for f in sse_data(raw) if f != b"[DONE]"] if stream else [json.loads(raw)]
            assert docs and all(d["model"] == f"c-{fault}" for d in docs)
    assert gw.get("/healthz")[0] == 200
    admin = gw.admin()
    assert admin["requests"] == [] if "requests" in admin else True
    wait_for(lambda: gw.admin()["backends"]["h"]["in_use"] == 0, timeout=5)
    # the hostile side: every connection of a failed request was closed (a few pooled ones remain)
    wait_for(lambda: hostile.get("/stats")["open"] <= 2, timeout=10)


def test_the_gateway_does_not_advertise_compression(gw, hostile):
    _ask(gw, "openai", "good", False)
    assert "gzip" not in hostile.get("/last-headers").get("accept-encoding", "")


def test_too_large_and_malformed_are_counted_under_their_own_kinds(gw):
    for fault in ("huge-line", "invalid-json"):
        _ask(gw, "openai", fault, False)
    _status, metrics = gw.get("/metrics")
    assert 'hlf_upstream_errors_total{backend="h",kind="too_large"}' in metrics
    assert 'hlf_upstream_errors_total{backend="h",kind="malformed"}' in metrics
    outcomes = {e.get("outcome") for e in gw.access_log()}
    assert {"error_upstream_too_large", "error_upstream_malformed"} <= outcomes


def test_memory_stays_bounded_under_100_mib_lines_and_bodies_and_comes_back(hostile):
    # 16 MiB is the default body limit; a line limit of 4 MiB rather than 1 makes what is held
    # beyond the limit (the HTTP client's read buffers, under 1 MiB) small beside it
    line_limit, body_limit = 4 * MiB, 16 * MiB
    with Gateway(_config(hostile.base, timeouts={"nonstream_s": 30, "first_token_s": 30, "idle_s": 30},
                         limits={"max_line_bytes": line_limit, "max_body_bytes": body_limit})) as gw:
        pid = gw.proc.pid
        for _ in range(2):  # warm up: first requests allocate what every later one reuses
            _ask(gw, "openai", "good", True)
            _ask(gw, "anthropic", "good", False)
        base = _rss_kib(pid)
        peak = [base]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss_kib(pid))
                time.sleep(0.005)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            for dialect in ("openai", "anthropic"):
                status, _, raw = _ask(gw, dialect, "huge-line", True)
                assert status == 200 and b"larger than" in raw
            line_peak = peak[0]
            for dialect in ("openai", "anthropic"):
                for fault in ("huge-body", "huge-length"):
                    status, _, raw = _ask(gw, dialect, fault, False)
                    assert status == 502 and b"larger than" in raw
            t0 = time.monotonic()
            status, _ = gw.get("/healthz")
            healthz_s = time.monotonic() - t0
        finally:
            stop.set()
            t.join()
        print(f"\nRSS KiB: base {base}, peak after the 100 MiB lines {line_peak}, peak after the 100 MiB bodies "
              f"{peak[0]}, now {_rss_kib(pid)}; /healthz {healthz_s * 1000:.1f} ms")
        assert status == 200 and healthz_s < 1.0
        assert (line_peak - base) * 1024 < 2 * line_limit, (base, line_peak)
        assert (peak[0] - base) * 1024 < 2 * body_limit, (base, peak[0])
        wait_for(lambda: (_rss_kib(pid) - base) * 1024 < body_limit, timeout=10)


def test_a_stopped_upstream_times_out_and_frees_everything():
    h = Hostile()
    try:
        # a slot for each of the four at once: each waits out its own timeout, not the others'
        with Gateway(_config(h.base, slots=4)) as gw:
            assert _ask(gw, "openai", "good", False)[0] == 200
            os.kill(h.proc.pid, signal.SIGSTOP)
            try:
                asks = [(dialect, stream) for dialect in ("openai", "anthropic") for stream in (False, True)]
                with ThreadPoolExecutor(len(asks)) as pool:
                    answers = list(pool.map(lambda a: _ask(gw, a[0], "good", a[1]), asks))
                for (dialect, _), (status, _, raw) in zip(asks, answers):
                    assert status == 504, raw
                    doc = json.loads(raw)
                    if dialect == "openai":
                        assert _openai_error(doc)["code"] == "timeout"
                    else:
                        assert _anthropic_error(doc)["type"] == "timeout_error"
                wait_for(lambda: gw.admin()["backends"]["h"]["in_use"] == 0, timeout=5)
            finally:
                os.kill(h.proc.pid, signal.SIGCONT)
            assert _ask(gw, "openai", "good", True)[0] == 200
    finally:
        h.stop()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_vanished_clients_slot_goes_on_only_after_the_upstream_can_have_seen_the_close(hostile, dialect):
    """Item 8 of issue 14: a freed slot handed on before the upstream noticed the close let the
    upstream run slots + 1 requests for a moment. With one slot, the next request may reach the
    upstream only after the vanished one's connection closed there, plus the release grace."""
    from rawhttp import post_and_vanish

    with Gateway(_config(hostile.base, slots=1)) as gw:
        hostile.get("/events")
        path = "/llm/v1/chat/completions" if dialect == "openai" else "/llm/v1/messages"
        gaps = []
        for _ in range(5):
            waiter = threading.Thread(target=_ask, args=(gw, dialect, "good", True))
            body = {"model": "c-hang-body", "stream": True, "max_tokens": 16,
                    "messages": [{"role": "user", "content": "hi"}]}
            vanisher = threading.Thread(target=post_and_vanish, args=(gw.url + path, body),
                                        kwargs={"after_bytes": 1, "after_s": 0.3})
            vanisher.start()
            wait_for(lambda: gw.admin()["backends"]["h"]["in_use"] == 1, timeout=5)
            waiter.start()  # queued behind the held slot
            vanisher.join()
            waiter.join()
            events = hostile.get("/events")
            closed = next(t for t, kind, model in events if kind == "closed" and model == "hang-body")
            nxt = next(t for t, kind, model in events if kind == "request" and model == "good")
            gaps.append(nxt - closed)
        # The order is the invariant, read off the upstream's own clock: the close reached it before
        # the next request did. The grace only makes that likely; how much of it is left once the
        # upstream has read the close depends on how busy the machine is, so it is not asserted.
        assert min(gaps) > 0, gaps



@pytest.mark.parametrize("fault, says", [("embed-short", "1 embeddings for 2 inputs"),
                                         ("embed-strings", "an embedding is not a list of numbers")])
def test_wrong_embeddings_are_the_backends_fault_in_every_dialect_that_reshapes_them(gw, fault, says):
    """Gemini's and Ollama's embeddings re-shape the backend's vectors: both check them the one
    way (surfaces/embeddings.vectors), so a short or base64 answer is a 502 naming the backend,
    never a short or broken answer relayed as the model's."""
    model = f"c-{fault}"
    status, _, raw = post_raw(gw.url + "/api/embed", {"model": model, "input": ["a", "b"]}, timeout=30)
    assert status == 502 and json.loads(raw)["error"] == f"backend 'h': {says}", raw
    status, _, raw = post_raw(gw.url + f"/llm/v1beta/models/{model}:batchEmbedContents",
                              {"requests": [{"content": {"parts": [{"text": t}]}} for t in ("a", "b")]}, timeout=30)
    err = json.loads(raw)["error"]
    assert status == 502 and err["status"] == "UNAVAILABLE" and err["message"] == f"backend 'h': {says}", raw


def test_tool_arguments_a_stream_cannot_place_are_logged_with_the_request(gw):
    """Interleaved arguments of two calls: Anthropic's grammar (one block open at a time) cannot
    place call 0's once call 1 has begun; they are dropped, and the operator reads a warning
    naming the request and the backend. Ollama holds every call to the end: it places them all."""
    body = {"model": "c-interleaved", "stream": True, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"name": "g", "input_schema": {"type": "object"}}]}
    status, headers, raw = post_raw(gw.url + "/llm/v1/messages", body, timeout=30)
    assert status == 200 and b"message_stop" in raw, raw
    rid = headers["request-id"]
    line = f"request {rid}: 1 tool-call argument fragments from backend h had no open call in the anthropic stream"
    wait_for(lambda: line in gw.stderr(), timeout=10)
    status, headers, raw = post_raw(gw.url + "/api/chat", {"model": "c-interleaved", "messages": body["messages"],
                                                          "tools": [{"type": "function", "function": {"name": n}}
                                                                    for n in ("f", "g")]}, timeout=30)
    last = json.loads(raw.splitlines()[-1])
    calls = [json.loads(x)["message"].get("tool_calls") for x in raw.splitlines() if b"tool_calls" in x]
    assert status == 200 and last["done"] and [c["function"]["arguments"] for c in calls[0]] == [{"a": 1}, {"b": 2}]
    assert f"request {headers['request-id']}:" not in gw.stderr()


# each dialect's streamed request for model c-think-merged, and how its reasoning is read back
_THINK_REQUESTS = {
    "openai": ("/llm/v1/chat/completions", {"model": "c-think-merged", "stream": True,
                                            "messages": [{"role": "user", "content": "2+2?"}]}),
    "anthropic": ("/llm/v1/messages", {"model": "c-think-merged", "stream": True, "max_tokens": 64,
                                       "messages": [{"role": "user", "content": "2+2?"}]}),
    "responses": ("/llm/v1/responses", {"model": "c-think-merged", "stream": True, "input": "2+2?", "store": False}),
    "gemini": ("/llm/v1beta/models/c-think-merged:streamGenerateContent?alt=sse",
               {"contents": [{"role": "user", "parts": [{"text": "2+2?"}]}],
                "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}),
    "ollama": ("/api/chat", {"model": "c-think-merged", "messages": [{"role": "user", "content": "2+2?"}]}),
}


def _reasoning_of(dialect: str, raw: bytes) -> str:
    if dialect == "ollama":
        return "".join(json.loads(x)["message"].get("thinking", "") for x in raw.splitlines() if x.strip())
    docs = [json.loads(d) for d in sse_data(raw) if d != b"[DONE]"]
    if dialect == "openai":
        return "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in docs if c.get("choices"))
    if dialect == "anthropic":
        return "".join(d["delta"].get("thinking", "") for d in docs
                       if d.get("type") == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
    if dialect == "responses":
        return "".join(d["delta"] for d in docs if d.get("type") == "response.reasoning_text.delta")
    return "".join(p["text"] for d in docs for c in d.get("candidates", [])
                   for p in c.get("content", {}).get("parts", []) if p.get("thought"))


@pytest.mark.parametrize("dialect", list(_THINK_REQUESTS))
def test_a_think_tag_merged_into_the_first_reasoning_delta_is_not_the_clients_reasoning(gw, dialect):
    """vLLM 0.32's think-tag parsers leave `<think>` in the reasoning when the tag arrives in one
    delta with the next tokens (its API server merges engine steps when it falls behind: found by
    tests/real/test_vllm_dialects.py on a busy machine). Every dialect's client reads the reasoning
    that the same answer unstreamed has, and the content after it."""
    path, body = _THINK_REQUESTS[dialect]
    status, _, raw = post_raw(gw.url + path, body, timeout=30)
    assert status == 200, raw
    assert _reasoning_of(dialect, raw) == "Two and two make four.", raw
    assert b"<think>" not in raw and b"Four." in raw, raw


# each dialect's streamed request for model c-slow-eof, and the bytes of its last frame
_LAST_FRAME = {
    "openai": ("/llm/v1/chat/completions", {"model": "c-slow-eof", "stream": True,
                                            "messages": [{"role": "user", "content": "hi"}]}, b"[DONE]"),
    "anthropic": ("/llm/v1/messages", {"model": "c-slow-eof", "stream": True, "max_tokens": 16,
                                       "messages": [{"role": "user", "content": "hi"}]}, b"message_stop"),
    "responses": ("/llm/v1/responses", {"model": "c-slow-eof", "stream": True, "input": "hi", "store": False},
                  b"response.completed"),
    "ollama": ("/api/chat", {"model": "c-slow-eof", "messages": [{"role": "user", "content": "hi"}]}, b'"done":true'),
}


@pytest.mark.parametrize("dialect", list(_LAST_FRAME))
def test_a_client_that_hangs_up_at_the_last_frame_got_an_ok_answer(gw, dialect):
    """The OpenAI SDK closes its connection as soon as it reads `[DONE]` (openai 3.x, sync), while
    the gateway may still be reading the upstream's end of body: that client got the whole answer,
    and the access log, metrics and ledger must say ok, not cancelled. The upstream here ends its
    body 0.3 s after its last frame, so the hang-up always falls in that moment."""
    path, body, last = _LAST_FRAME[dialect]
    seen = len(gw.access_log())
    got = post_and_vanish(gw.url + path, body, until=last, rst=True)
    assert last in got, got
    line, = wait_for(lambda: [r for r in gw.access_log()[seen:] if r.get("model") == "c-slow-eof"], timeout=10)
    assert (line["outcome"], line["status"]) == ("ok", 200), line
