"""Client connection hygiene against a real gateway process: slowloris heads, silent and idle
connections and a connection flood are closed or evicted on the configured deadlines, while
normal requests keep being served. Small deadlines in the test's config keep it short."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for

HEAD_S = 1.0
KEEPALIVE_S = 1.5


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "m") as s:
        yield s


def _gateway(stub, **connections) -> Gateway:
    cfg = config_for({"b": {"url": stub.base, "slots": 4}}, {"m": {"backend": "b"}},
                     connections={"head_timeout_s": HEAD_S, "keepalive_timeout_s": KEEPALIVE_S, **connections})
    return Gateway(cfg)


def _connect(gw: Gateway) -> socket.socket:
    u = urlsplit(gw.url)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    return s


def _closed_by_peer(s: socket.socket, within: float) -> float | None:
    """Seconds until the peer closed the connection (recv returns b"" or resets), else None."""
    t0 = time.monotonic()
    s.settimeout(within)
    try:
        while True:
            got = s.recv(4096)
            if not got:
                return time.monotonic() - t0
    except ConnectionResetError:
        return time.monotonic() - t0
    except TimeoutError:
        return None


def _healthy(gw: Gateway) -> bool:
    status, doc = gw.post("/llm/v1/chat/completions",
                          {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    return status == 200 and doc["choices"][0]["message"]["content"] is not None


def test_slowloris_heads_are_cut_at_the_head_deadline_and_others_are_served(stub):
    with _gateway(stub) as gw:
        socks = [_connect(gw) for _ in range(30)]
        stop = threading.Event()

        def trickle():  # one header byte per connection every 0.2 s: the head never completes
            i = 0
            head = b"POST /llm/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
            while not stop.is_set() and i < len(head):
                for s in socks:
                    try:
                        s.send(head[i:i + 1])
                    except OSError:
                        pass
                i += 1
                time.sleep(0.2)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            served = sum(_healthy(gw) for _ in range(5))  # meanwhile, normal requests
            closed = [_closed_by_peer(s, within=HEAD_S + 3) for s in socks]
        finally:
            stop.set()
            t.join()
            for s in socks:
                s.close()
        assert served == 5
        assert all(c is not None for c in closed), closed  # every slowloris connection was closed
        assert _healthy(gw)


def test_silent_connections_are_closed_at_the_head_deadline(stub):
    with _gateway(stub) as gw:
        socks = [_connect(gw) for _ in range(20)]
        t0 = time.monotonic()
        try:
            closed = [_closed_by_peer(s, within=HEAD_S + 3) for s in socks]
        finally:
            for s in socks:
                s.close()
        assert all(c is not None for c in closed), closed
        assert time.monotonic() - t0 < HEAD_S + 3
        assert _healthy(gw)


def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(stub):
    with _gateway(stub, head_timeout_s=30) as gw:
        u = urlsplit(gw.url)
        s = _connect(gw)
        try:
            s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode())
            s.settimeout(5)
            got = s.recv(4096)
            assert got.startswith(b"HTTP/1.1 200")
            # the head deadline (30 s) is not what closes it: the keep-alive timeout is
            waited = _closed_by_peer(s, within=KEEPALIVE_S + 3)
        finally:
            s.close()
        assert waited is not None and waited >= KEEPALIVE_S - 0.3


def test_a_keep_alive_connection_serves_several_requests_within_the_deadlines(stub):
    with _gateway(stub) as gw:
        u = urlsplit(gw.url)
        s = _connect(gw)
        try:
            for _ in range(3):
                s.sendall(f"GET /healthz HTTP/1.1\r\nHost: {u.hostname}\r\n\r\n".encode())
                s.settimeout(5)
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
                time.sleep(HEAD_S * 0.7)  # idle, but within the keep-alive timeout
        finally:
            s.close()


def test_a_flood_of_idle_connections_past_the_cap_does_not_lock_out_normal_requests(stub):
    with _gateway(stub, head_timeout_s=30, keepalive_timeout_s=30, max_connections=20) as gw:
        socks = [_connect(gw) for _ in range(60)]  # three times the cap, all silent
        try:
            time.sleep(0.3)
            served = sum(_healthy(gw) for _ in range(5))
            wait_for(lambda: "connections.max_connections" in gw.stderr(), timeout=5)
        finally:
            for s in socks:
                s.close()
        assert served == 5
        line = next(ln for ln in gw.stderr().splitlines() if "connections.max_connections" in ln)
        assert "limit of 20 open connections" in line and "oldest idle" in line
        assert _healthy(gw)
