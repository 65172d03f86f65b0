"""Issue 14, items 6 and 7 against a real gateway: a backend its probe marked down is a 503 that
says "down" in every dialect, streaming or not, with Retry-After = the probe interval, naming the
backend and its error once; a request the HTTP parser refuses is the client's fault and logged at
INFO, never ERROR."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import free_port, wait_for


@pytest.mark.parametrize("stream", [False, True])
def test_a_probe_down_backend_is_503_down_with_the_probe_interval_as_retry_after(stream):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    cfg = config_for({"a": {"url": dead, "health_interval_s": 7, "timeouts": {"connect_s": 1}}},
                     {"m": {"backend": "a"}})
    with Gateway(cfg) as gw:
        wait_for(lambda: gw.get("/readyz")[1]["backends"] == {"a": False}, 10)
        body = {"model": "m", "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        status, headers, raw = post_raw(gw.base + "/chat/completions", body)
        err = json.loads(raw)["error"]
        assert status == 503 and err["code"] == "backend_down" and err["type"] == "server_error"
        assert err["message"] == "model 'm' is down: backend 'a' is unreachable (connection refused)"
        assert headers["retry-after"] == "7"
        status, headers, raw = post_raw(gw.base + "/messages", body)
        doc = json.loads(raw)
        assert status == 503 and doc["type"] == "error" and doc["error"]["type"] == "backend_down_error"
        assert headers["retry-after"] == "7"
        outcomes = [e["outcome"] for e in gw.access_log() if e.get("path", "").startswith("/llm")]
        assert outcomes[-2:] == ["error_backend_down", "error_backend_down"]
        _, metrics = gw.get("/metrics")
        assert 'hlf_upstream_errors_total{backend="a",kind="down"} 2.0' in metrics


MSGS = [{"role": "user", "content": "hi"}]
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
# dialect -> (path, body, the message as that dialect's error shape carries it)
DIALECTS = {
    "openai": ("/llm/v1/chat/completions", {"model": "m", "messages": MSGS}, lambda d: d["error"]["message"]),
    "anthropic": ("/llm/v1/messages", {"model": "m", "max_tokens": 8, "messages": MSGS},
                  lambda d: d["type"] == "error" and d["error"]["message"]),
    "responses": ("/llm/v1/responses", {"model": "m", "input": "hi"}, lambda d: d["error"]["message"]),
    "gemini": ("/llm/v1beta/models/m:generateContent", GEMINI,
               lambda d: d["error"]["status"] == "UNAVAILABLE" and d["error"]["message"]),
    "ollama": ("/api/chat", {"model": "m", "messages": MSGS, "stream": False}, lambda d: d["error"]),
    "completions": ("/llm/v1/completions", {"model": "m", "prompt": "x"}, lambda d: d["error"]["message"]),
    "infill": ("/infill", {"model": "m", "input_prefix": "a", "input_suffix": "b"},
               lambda d: d["error"]["code"] == 503 and d["error"]["message"]),
}


def test_a_503_names_the_backend_and_its_error_once_in_every_dialects_shape():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = config_for({"a": {"url": dead, "kind": "llamacpp", "health_interval_s": 7, "timeouts": {"connect_s": 1}}},
                     {"m": {"backend": "a"}})
    with Gateway(cfg) as gw:
        wait_for(lambda: gw.get("/readyz")[1]["backends"] == {"a": False}, 10)
        for dialect, (path, body, message_of) in DIALECTS.items():
            status, headers, raw = post_raw(gw.url + path, body)
            assert status == 503 and headers["retry-after"] == "7", (dialect, status, raw)
            assert message_of(json.loads(raw)) == "model 'm' is down: backend 'a' is unreachable (connection refused)", (
                dialect, raw)
            assert raw.count(b"'a'") == 1, (dialect, raw)  # the name once in the whole answer


def test_a_request_the_parser_refuses_is_logged_at_info_not_error():
    cfg = config_for({"a": {"url": f"http://127.0.0.1:{free_port()}/v1"}}, {"m": {"backend": "a"}})
    with Gateway(cfg) as gw:
        u = urlsplit(gw.url)
        for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
            with socket.create_connection((u.hostname, u.port), timeout=5) as s:
                s.sendall(junk)
                assert s.recv(4096).split(b" ")[1] == b"400"
        wait_for(lambda: "request refused with 400" in gw.stderr(), 5)
        lines = [ln for ln in gw.stderr().splitlines() if "request refused with 400" in ln]
        assert lines and all(" INFO " in ln and " ERROR " not in ln for ln in lines), lines
        assert " ERROR " not in gw.stderr()
