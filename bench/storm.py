"""`python -m bench.storm`: does the upstream ever run more requests than the backend's slots?

A storm of streaming requests (default 300, 40 at a time) against a gateway whose backend has 4
slots, with a random half of the clients vanishing mid-answer (a close, or a reset). The judge
is the upstream's own peak of requests in flight (the stub's /stub/stats `max_in_flight`), never
the gateway's word. Each run resets the stub's stats first; the report is every run's peak and
how many runs overshot. Loopback only, bounded (a few seconds per run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import urllib.request
from urllib.parse import urlsplit

from .procs import Proc, start_gateway, workdir


def _post(url: str) -> dict:
    req = urllib.request.Request(url, method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


VANISH = 0.5  # share of clients that vanish
VANISH_S = 0.12  # ... within this many seconds of sending


async def _one(host: str, port: int, rng: random.Random) -> None:
    """One client: either dialect, streaming or not; VANISH of them vanish within VANISH_S."""
    tokens = rng.randint(5, 40)
    stream = rng.random() < 0.75
    path = "/llm/v1/chat/completions" if rng.random() < 0.5 else "/llm/v1/messages"
    body = json.dumps({"model": "m", "stream": stream, "max_tokens": 256,
                       "messages": [{"role": "user", "content": f"[stub content={tokens} delay_ms=3]"}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection(host, port)
    vanish_after = rng.uniform(0.0, VANISH_S) if rng.random() < VANISH else None
    try:
        writer.write(head + body)
        await writer.drain()
        if vanish_after is None:
            while await reader.read(65536):
                pass
        else:
            try:
                async with asyncio.timeout(vanish_after):
                    while await reader.read(65536):
                        pass
            except TimeoutError:
                pass
            if rng.random() < 0.5:  # a reset, like a client host that vanished
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        writer.close()


async def _storm(url: str, n: int, concurrency: int, seed: int) -> None:
    u = urlsplit(url)
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)

    async def guarded() -> None:
        async with sem:
            try:
                await _one(u.hostname, u.port, rng)
            except OSError:
                pass

    await asyncio.gather(*(guarded() for _ in range(n)))


def run(runs: int, n: int, concurrency: int, slots: int, seed: int) -> list[int]:
    wd = workdir()
    stub = Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--port", "0", "--model", "m"], wd)
    gw = None
    peaks = []
    try:
        gw = start_gateway(wd, stub.url, "m", "m", slots=slots)
        for r in range(runs):
            _post(stub.url + "/stub/reset")
            asyncio.run(_storm(gw.url, n, concurrency, seed + r))
            peaks.append(_get(stub.url + "/stub/stats")["max_in_flight"])
        return peaks
    finally:
        if gw is not None:
            gw.stop()
        stub.stop()


def main(argv: list[str] | None = None) -> int:
    global VANISH, VANISH_S
    ap = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("-n", type=int, default=300, help="requests per run")
    ap.add_argument("-c", "--concurrency", type=int, default=40)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vanish", type=float, default=VANISH, help="share of clients that vanish")
    ap.add_argument("--vanish-ms", type=float, default=VANISH_S * 1000, help="they vanish within this")
    args = ap.parse_args(argv)
    VANISH, VANISH_S = args.vanish, args.vanish_ms / 1000
    peaks = run(args.runs, args.n, args.concurrency, args.slots, args.seed)
    over = sum(p > args.slots for p in peaks)
    print(f"upstream peak in flight per run (slots {args.slots}, {args.n} requests, concurrency "
          f"{args.concurrency}, {args.vanish:.0%} of the clients vanish within {args.vanish_ms:g} ms): {peaks}")
    print(f"runs over the slots: {over} of {len(peaks)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
