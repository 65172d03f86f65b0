"""A client that stops reading mid-stream (a laptop put to sleep, a frozen process): the gateway's
own timeout ends the request, frees the slot and stops the generation, and what the client finds
on its connection is the one answer it asked for, never a second HTTP response inside it."""

from __future__ import annotations

import socket

import pytest

from gwproc import Gateway, config_for
from rawhttp import _request_bytes
from stubproc import start_stub, wait_for


def _send_buffer_max() -> int:
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


# Enough to fill every buffer between the gateway and a client that reads nothing: the gateway's
# socket send buffer grows to at most tcp_wmem's maximum; the client's is pinned small.
TOKEN_BYTES = 4000
TOKENS = (_send_buffer_max() + (2 << 20)) // TOKEN_BYTES


@pytest.fixture(scope="module")
def big_stub():
    with start_stub("vllm", "--model", "m", "--token-delay-ms", "0", "--max-model-len", "200000") as s:
        yield s


def _request(dialect: str) -> tuple[str, dict]:
    prompt = f"[stub content={TOKENS} delay_ms=0 text={'x' * TOKEN_BYTES}]"
    if dialect == "openai":
        return "/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    return "/messages", {"model": "m", "stream": True, "max_tokens": 100000,
                         "messages": [{"role": "user", "content": prompt}]}


def _read_all(s: socket.socket, timeout: float = 20.0) -> bytes:
    s.settimeout(timeout)
    buf = b""
    while True:
        try:
            got = s.recv(1 << 20)
        except (TimeoutError, ConnectionError):
            break
        if not got:
            break
        buf += got
    return buf


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_stalled_client_gets_one_response_and_frees_the_slot(big_stub, dialect):
    # idle_s leaves a busy machine's stub room to keep producing: a stub starved of CPU for
    # idle_s looks like a silent backend, and the watchdog rightly blames the backend then
    backend = {"url": big_stub.base, "slots": 1, "timeouts": {"idle_s": 4, "first_token_s": 10}}
    with Gateway(config_for({"b": backend}, {"m": {"backend": "b"}})) as gw:
        path, body = _request(dialect)
        addr, req = _request_bytes(gw.base + path, body)
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(addr)
            s.sendall(req)
            # Reads nothing: the gateway's writes block, the upstream goes unread, and after
            # idle_s the watchdog ends the request, blaming the client, not the backend.
            rec = wait_for(lambda: [r for r in gw.access_log() if r["path"].endswith(path)], 30, 0.1)[-1]
            wait_for(lambda: gw.admin()["backends"]["b"]["in_use"] == 0, 2)
            assert gw.admin()["requests"] == []
            raw = _read_all(s)
        finally:
            s.close()
        # the scenario really happened, and it is the client's doing, not the backend's
        assert rec["outcome"] == "cancelled_client_stalled", str(rec)
        # The client got a 200 and the start of its stream...
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        # ...and nothing but that one response (no error response inside its body), as logged.
        assert raw.count(b"HTTP/1.1 ") == 1, raw[raw.rfind(b"HTTP/1.1 ") - 200:][:600]
        assert rec["status"] == 200, rec
        assert b"stopped reading" in raw[-1000:]  # its stream ends with the reason, in its dialect
        wait_for(lambda: big_stub.stats()["in_flight"] == 0, 5)
        # The slot is free for the next request.
        status, doc = gw.post("/llm/v1/chat/completions",
                              {"model": "m", "messages": [{"role": "user", "content": "[stub content=2]"}]})
        assert status == 200 and doc["choices"][0]["message"]["content"], doc
