"""bench.swap: two models on a GPU with room for one, a mixed workload, the swap policy
against plain FIFO (what llama-swap does).

    python -m bench.swap [--clients 6] [--requests 5] [--start-delay-s 1.5] [--swap-after-s 20]

Each run starts a fresh gateway whose two backends are managed stub servers (the gateway
spawns them from `run.cmd`; each takes --start-delay-s to "load its model", like vLLM binding its
port only once loaded) with `uses` = the whole `resources`, so only one runs at a time. Several
clients each send a sequence of requests alternating between the two models (half start with
either), with a short pause between them. Reported per policy: swaps (a backend stopped to make
room for the other, from the gateway's /metrics), starts, the wait of every request from arrival
to admission (the gateway's Server-Timing `queue` part, which includes waiting for a load), the
total time of the workload, and the requests refused (a queue timeout, 60 s here: must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import sys
import time

import aiohttp
import yaml

from bench.procs import Proc, workdir

TOKENS, DELAY_MS = 10, 40  # each answer: 10 tokens, 40 ms apart (about 0.4 s of generation)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(policy: str, start_delay_s: float, swap_after_s: float, slots: int) -> dict:
    backends = {}
    for name in ("a", "b"):
        port = _free_port()
        backends[name] = {
            "url": f"http://127.0.0.1:{port}/v1", "kind": "vllm", "slots": slots,
            "queue": {"depth": 256, "timeout_s": 60},
            "run": {"cmd": [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", str(port),
                            "--model", f"m{name}", "--start-delay-s", str(start_delay_s)],
                    "uses": {"gpu": 1}, "stop_timeout_s": 5},
        }
    return {"resources": {"gpu": 1}, "lifecycle": {"policy": policy, "swap_after_s": swap_after_s},
            "backends": backends, "models": {"ma": {"backend": "a"}, "mb": {"backend": "b"}}}


_QUEUE = re.compile(r"queue;dur=([\d.]+)")


async def client(session: aiohttp.ClientSession, url: str, i: int, n: int, rng: random.Random,
                 waits: list[float], refused: list[int]) -> None:
    for k in range(n):
        model = "ma" if (i + k) % 2 == 0 else "mb"
        body = {"model": model, "max_tokens": 64,
                "messages": [{"role": "user", "content": f"[stub content={TOKENS} delay_ms={DELAY_MS}] client {i}"}]}
        async with session.post(url + "/llm/v1/chat/completions", json=body) as r:
            raw = await r.read()
            if r.status != 200 and os.environ.get("HLF_BENCH_DEBUG"):
                print(r.status, raw[:300], file=sys.stderr)
            m = _QUEUE.search(r.headers.get("server-timing", ""))
            if r.status != 200:
                refused.append(r.status)
            elif m:
                waits.append(float(m.group(1)) / 1000)
        await asyncio.sleep(rng.uniform(0.0, 0.3))


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def workload(url: str, clients: int, requests: int, seed: int) -> dict:
    waits: list[float] = []
    refused: list[int] = []
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(client(session, url, i, requests, random.Random(rng.random()), waits, refused)
                               for i in range(clients)))
        total = time.monotonic() - t0
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    return {"waits": sorted(waits), "refused": len(refused), "total_s": total,
            "swaps": int(_metric(text, "hlf_backend_swaps_total")),
            "starts": int(_metric(text, "hlf_backend_starts_total")),
            "load_wait_s": _metric(text, "hlf_backend_load_wait_seconds_total")}


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def run_one(policy: str, args: argparse.Namespace, wd: str) -> dict:
    cfg = config(policy, args.start_delay_s, args.swap_after_s, args.slots)
    path = os.path.join(wd, f"{policy}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    gw = Proc(f"gateway-{policy}", [sys.executable, "-m", "homelab_frontend", "serve", "--config", path,
                                    "--port", "0"], wd)
    try:
        return asyncio.run(workload(gw.url, args.clients, args.requests, args.seed))
    finally:
        gw.stop()  # SIGTERM: the gateway stops the server it started before it exits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.swap", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--requests", type=int, default=4, help="per client, alternating models")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--start-delay-s", type=float, default=1.5)
    p.add_argument("--swap-after-s", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    wd = workdir()
    rows = {pol: run_one(pol, args, wd) for pol in ("batch", "fifo")}
    n = args.clients * args.requests
    print(f"\n{n} requests ({args.clients} clients x {args.requests}, alternating 2 models), room for one model, "
          f"start delay {args.start_delay_s:g} s, {args.slots} slots each, swap_after_s {args.swap_after_s:g}\n")
    print("| policy | swaps | starts | wait p50 | wait p95 | wait max | total | refused |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for pol, r in rows.items():
        w = r["waits"]
        name = "batch (ours)" if pol == "batch" else "fifo (llama-swap)"
        print(f"| {name} | {r['swaps']} | {r['starts']} | {_pct(w, 0.5):.2f} s | {_pct(w, 0.95):.2f} s | "
              f"{max(w, default=float('nan')):.2f} s | {r['total_s']:.1f} s | {r['refused']} |")
    b, f = rows["batch"], rows["fifo"]
    ratio = f["swaps"] / b["swaps"] if b["swaps"] else float("inf")
    print(f"\nFIFO swaps / batch swaps = {ratio:.1f}x; p95 wait batch/FIFO = "
          f"{_pct(b['waits'], 0.95) / max(_pct(f['waits'], 0.95), 1e-9):.2f}; "
          f"total time batch/FIFO = {b['total_s'] / f['total_s']:.2f}")
    ok = ratio >= 3 and _pct(b["waits"], 0.95) <= _pct(f["waits"], 0.95) and b["refused"] == f["refused"] == 0
    print("goal (>= 3x fewer swaps, p95 no worse, nobody past the queue timeout):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
