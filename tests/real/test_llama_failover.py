"""Two real llama-servers behind one model; one is killed (SIGKILL) while several clients run many
short streams: nobody sees an error for a request that had not started answering (it fails over
to the other server), the streams running on the killed one end with the error frame, no slot
leaks on either side (llama.cpp's own counters, and the gateway's), and once it is back on its
port it is used again within seconds (its own token counter moves)."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from gwproc import Gateway, config_for
from llamaproc import ALIAS, MODEL, LlamaServer, require_llama
from rawhttp import _dechunk, _request_bytes, sse_data
from stubproc import wait_for

pytestmark = pytest.mark.timeout(400)
CLIENTS = 4
LONG = "Write a very long story about a dragon."


def _stream(url: str, max_tokens: int, prompt: str = "Say hi.") -> tuple[int, bytes, str]:
    """-> (status, the stream's data payloads joined, request id); status 0: no response head."""
    addr, req = _request_bytes(url, {"model": MODEL, "stream": True, "max_tokens": max_tokens,
                                     "messages": [{"role": "user", "content": prompt}]})
    with socket.create_connection(addr, timeout=120) as s:
        s.sendall(req)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/1.1 ") else 0
    rid = next((ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("request-id:")), "")
    return status, _dechunk(rest), rid


def _ok(body: bytes) -> bool:
    data = sse_data(body)
    return bool(data) and data[-1] == b"[DONE]" and b'"error"' not in body


def test_a_killed_backend_costs_only_the_streams_it_was_running():
    require_llama()
    with LlamaServer(parallel=2) as a0, LlamaServer(parallel=2) as b:
        cfg = config_for(
            {n: {"url": s.base, "kind": "llamacpp", "slots": 2, "health_interval_s": 30} for n, s in (("a", a0), ("b", b))},
            {MODEL: {"backends": ["a", "b"], "upstream_model": ALIAS, "affinity": False}},
        )
        servers = {"a": a0, "b": b}
        with Gateway(cfg) as gw:
            url = gw.base + "/chat/completions"
            # a long stream on each backend (the second goes to the one with more free slots)
            longs: list[tuple[int, bytes, str]] = []
            threads = [threading.Thread(target=lambda: longs.append(_stream(url, 900, LONG)))]
            threads[0].start()
            first = wait_for(lambda: [r for r in gw.admin()["requests"] if r["phase"] == "streaming"], 60)[0]
            victim, other = first["backend"], "b" if first["backend"] == "a" else "a"
            threads.append(threading.Thread(target=lambda: longs.append(_stream(url, 900, LONG))))
            threads[1].start()
            wait_for(lambda: {r["backend"] for r in gw.admin()["requests"] if r["phase"] == "streaming"} == {"a", "b"}, 60)

            results: list[tuple[int, bytes, str]] = []
            stop = threading.Event()

            def client() -> None:
                while not stop.is_set():
                    results.append(_stream(url, 8))

            threads += [threading.Thread(target=client) for _ in range(CLIENTS)]
            for t in threads[2:]:
                t.start()
            wait_for(lambda: len(results) >= 8, 120)
            dead = servers[victim]
            dead.proc.send_signal(signal.SIGKILL)
            dead.proc.wait()
            n_at_kill = len(results)
            wait_for(lambda: len(results) >= n_at_kill + 12, 120)  # life goes on, on the other one

            # back where it was: the re-probe (soon, with backoff) takes it back
            with LlamaServer(parallel=2, port=dead.port) as back:
                wait_for(lambda: gw.admin()["backends"][victim]["up"], 60)
                wait_for(lambda: back.metrics().get("llamacpp:tokens_predicted_total", 0) > 0, 30)
                stop.set()
                for t in threads:
                    t.join(180)
                assert not any(t.is_alive() for t in threads)

                # no client saw an error for a request that had not started answering
                everything = results + longs
                assert all(status == 200 for status, _, _ in everything), \
                    sorted({status for status, _, _ in everything})
                log = {r["id"]: r for r in wait_for(lambda: len(gw.access_log()) >= len(everything)
                                                    and gw.access_log(), 30)}
                failed = [log[rid] for status, body, rid in everything if not _ok(body)]
                # the streams that broke were those answering on the killed server, with the error frame
                assert failed and all(r["backend"] == victim and r["outcome"] == "error_upstream_midstream"
                                      for r in failed), [(r["backend"], r["outcome"], r["status"], r.get("failovers")) for r in failed]
                assert all(b'"error"' in sse_data(body)[-1] for _, body, _ in everything if not _ok(body))
                long_outcomes = {log[rid]["backend"]: _ok(body) for _, body, rid in longs}
                assert long_outcomes == {victim: False, other: True}
                # the requests sent to it after its death went to the other one
                moved = [r for r in log.values() if r.get("failovers")]
                assert moved and all(r["outcome"] == "ok" and r["backend"] == other for r in moved)
                assert {f["backend"] for r in moved for f in r["failovers"]} == {victim}
                assert {f["cause"] for r in moved for f in r["failovers"]} <= {"unreachable", "reset"}
                # no slot leaks, by llama.cpp's own counters and by the gateway's
                wait_for(lambda: servers[other].idle() and back.idle(), 30)
                wait_for(lambda: all(x["in_use"] == 0 for x in gw.admin()["backends"].values()), 30)
