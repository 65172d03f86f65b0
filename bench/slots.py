"""What shared slots add to time-to-first-token, against the in-process pool.

Admission is on the path to the first token and giving a slot back is not (it runs in its own
task), so the cost of `cluster:` per request is the extra time `acquire()` takes. This measures
it directly, with no HTTP or backend noise:

    python -m bench.slots                          # starts a throwaway redis-server
    python -m bench.slots --redis-url redis://host:6379/0 --n 2000

or from the benchmark: `await slots_bench.compare(redis_url, n=1000)` -> a dict (see `compare`).

- `acquire`: uncontended take + give back, `n` times, for `SlotPool` and `RedisSlotPool`;
  `added_*_ms` is the difference of the percentiles, which is what a request's TTFT grows by.
- `handoff`: a slot given back on one replica and taken by a request queued on another (two
  registries in this process, woken by pub/sub): the wait a queued request sees on top of the slot
  actually coming free. The in-process pool hands over within the same event-loop tick.

Uses backend names `bench-<pid>-*` and a real epoch key, so against a shared Redis it waits out a
fresh epoch's grace like any replica would, and never touches real backends' leases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.request.tracker import Tracker


def _stats(samples_s: list[float]) -> dict:
    xs = sorted(samples_s)
    if not xs:
        return {}

    def pct(p: float) -> float:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 4)

    return {"p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
            "mean_ms": round(sum(xs) / len(xs) * 1000, 4), "n": len(xs)}


async def _acquire_cycles(pool, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await pool.acquire()
        out.append(time.perf_counter() - t0)
        pool.release()
    return out


async def _wait_grace(pool, timeout_s: float) -> None:
    """A Redis with no epoch yet grants nothing for its grace: take one slot to get past it."""
    pool.queue.timeout_s = timeout_s
    await pool.acquire()
    pool.release()
    await asyncio.sleep(0.05)  # let the release land


async def _handoffs(a, b, n: int) -> list[float]:
    out = []
    for _ in range(n):
        await a.acquire()
        taker = asyncio.get_running_loop().create_task(b.acquire())
        while b.queued == 0 and not taker.done():  # b is queued behind a's slot
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        a.release()
        await taker
        out.append(time.perf_counter() - t0)
        b.release()
        await asyncio.sleep(0.005)
    return out


async def compare(redis_url: str, n: int = 500, handoffs: int = 50, lease_s: float = 10.0) -> dict:
    """-> {"acquire": {"in_process": stats, "redis": stats, "added_p50_ms", "added_p99_ms"},
           "handoff": {"redis": stats}} with stats = {p50_ms, p90_ms, p99_ms, mean_ms, n}."""
    from homelab_frontend.admission.redis_registry import Registry  # needs the redis extra

    local = SlotPool("bench", 8, 64, 30.0)
    await _acquire_cycles(local, min(n, 100))  # warm-up
    local_s = await _acquire_cycles(local, n)

    name = f"bench-{os.getpid()}"
    regs = [Registry(cfgmod.Cluster(redis_url=redis_url, lease_s=lease_s, replica_id=f"{name}-{i}"), Tracker())
            for i in range(2)]
    try:
        for r in regs:
            await r.start()
            if not r.ok:
                raise RuntimeError(f"cannot reach Redis at {r.where}: {r.last_error}")
        shared = regs[0].pool(f"{name}-acquire", 8, 64, 30.0)
        await _wait_grace(shared, lease_s + 5)
        await _acquire_cycles(shared, min(n, 100))
        shared_s = await _acquire_cycles(shared, n)
        a = regs[0].pool(f"{name}-handoff", 1, 8, 30.0)
        b = regs[1].pool(f"{name}-handoff", 1, 8, 30.0)
        handoff_s = await _handoffs(a, b, handoffs)
    finally:
        for r in regs:
            await r.close()
    ls, rs = _stats(local_s), _stats(shared_s)
    return {
        "acquire": {"in_process": ls, "redis": rs,
                    "added_p50_ms": round(rs["p50_ms"] - ls["p50_ms"], 3),
                    "added_p99_ms": round(rs["p99_ms"] - ls["p99_ms"], 3)},
        "handoff": {"redis": _stats(handoff_s)},
    }


class _ThrowawayRedis:
    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("no --redis-url given and no redis-server on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="hlf-bench-redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise SystemExit("redis-server did not start")
                time.sleep(0.02)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slots", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", help="default: start a throwaway redis-server on a free loopback port")
    p.add_argument("--n", type=int, default=500, help="acquire/release cycles per pool (default 500)")
    p.add_argument("--handoffs", type=int, default=50, help="cross-replica handoffs (default 50)")
    p.add_argument("--lease-s", type=float, default=2.0,
                   help="lease for the bench replicas; also the grace a fresh Redis imposes (default 2)")
    args = p.parse_args(argv)
    server = None if args.redis_url else _ThrowawayRedis()
    try:
        url = args.redis_url or server.url
        result = asyncio.run(compare(url, args.n, args.handoffs, args.lease_s))
    finally:
        if server is not None:
            server.close()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
