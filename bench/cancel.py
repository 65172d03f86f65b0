"""`python -m bench.cancel`: how fast a vanished client's generation is stopped upstream.

For each phase (mid-stream in every dialect, before the first token, non-streaming) a client
sends a request to the gateway and drops its connection; the time until the stub upstream logs
`cancelled` is the time a GPU slot keeps generating for nobody. Loopback only, bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from urllib.parse import urlsplit

from .procs import Proc, start_gateway, workdir

PHASES = [
    ("mid-stream, anthropic", "/messages", "[stub content=400 delay_ms=20]", True, 600, 0.0),
    ("mid-stream, openai", "/chat/completions", "[stub content=400 delay_ms=20]", True, 600, 0.0),
    ("mid-stream, responses", "/responses", "[stub content=400 delay_ms=20]", True, 3000, 0.0),
    ("before first token", "/messages", "[stub ttft_ms=5000]", True, 0, 0.3),
    ("waiting for headers", "/chat/completions", "[stub headers_ms=5000]", True, 0, 0.3),
    ("non-streaming", "/chat/completions", "[stub content=400 delay_ms=20]", False, 0, 0.3),
]


def _vanish(url: str, path: str, prompt: str, stream: bool, after_bytes: int, after_s: float) -> None:
    u = urlsplit(url)
    if path == "/responses":
        body = json.dumps({"model": "m", "stream": stream, "store": False, "input": prompt}).encode()
    else:
        body = json.dumps({"model": "m", "stream": stream, "max_tokens": 1024,
                           "messages": [{"role": "user", "content": prompt}]}).encode()
    head = (f"POST /llm/v1{path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(head + body)
        got = 0
        while got < after_bytes:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        if after_s:
            time.sleep(after_s)


def _count(log: str) -> int:
    with open(log) as f:
        return f.read().count("cancelled")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cancel", description=__doc__)
    ap.add_argument("-n", type=int, default=20, help="disconnects per phase")
    args = ap.parse_args(argv)
    wd = workdir()
    log = os.path.join(wd, "stub.log")
    stub = Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--port", "0", "--model", "m", "--log", log], wd)
    gw = None
    try:
        gw = start_gateway(wd, stub.url, "m", "m", slots=8)
        print(f"{'phase':24s} {'p50 ms':>8s} {'max ms':>8s}   (client gone -> upstream generation cancelled, n={args.n})")
        for name, path, prompt, stream, after_bytes, after_s in PHASES:
            lat = []
            for _ in range(args.n):
                before = _count(log)
                _vanish(gw.url, path, prompt, stream, after_bytes, after_s)
                gone = time.monotonic()
                deadline = gone + 5
                while _count(log) == before:
                    if time.monotonic() > deadline:
                        print(f"{name}: the upstream was NOT cancelled within 5 s", file=sys.stderr)
                        return 1
                    time.sleep(0.0005)
                lat.append((time.monotonic() - gone) * 1000)
            print(f"{name:24s} {statistics.median(lat):8.2f} {max(lat):8.2f}")
        return 0
    finally:
        if gw is not None:
            gw.stop()
        stub.stop()


if __name__ == "__main__":
    sys.exit(main())
