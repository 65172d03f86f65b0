"""What latest-wins across replicas costs (admission/redis_supersede.py), with no HTTP noise:

    python -m bench.supersede                      # starts a throwaway redis-server
    python -m bench.supersede --redis-url redis://host:6379/0 --n 2000

- `register`: entering `latest()` for a new completion (nothing to cancel), in process
  (supersede.Supersede) and through Redis: the time a completion waits before it queues for
  its slot;
- `cross_replica_cancel`: two replicas (two registries in this process); from a completion
  arriving on one to the older one of its client being cancelled on the other.
Client names are `bench-<pid>`: against a shared Redis it cancels nobody's real completions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.supersede import Supersede

from .slots import _stats, _ThrowawayRedis


class _Handle:
    def __init__(self) -> None:
        self.cancelled_at: float | None = None

    def cancel(self, reason: str, message: str = "") -> bool:
        self.cancelled_at = time.perf_counter()
        return True


async def _registrations(sup, client: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with sup.latest(client, "coder", _Handle()):
            out.append(time.perf_counter() - t0)
    return out


async def _cancels(a, b, client: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        old = _Handle()
        async with a.latest(client, "coder", old):
            t0 = time.perf_counter()
            async with b.latest(client, "coder", _Handle()):
                async with asyncio.timeout(5):
                    while old.cancelled_at is None:
                        await asyncio.sleep(0)
            assert old.cancelled_at is not None
            out.append(old.cancelled_at - t0)
    return out


async def compare(redis_url: str, n: int = 1000) -> dict:
    from homelab_frontend.admission.redis_registry import Registry  # needs the redis extra
    from homelab_frontend.admission.redis_supersede import SharedSupersede

    client = f"bench-{os.getpid()}"
    local = Supersede()
    await _registrations(local, client, min(n, 100))  # warm-up
    local_s = await _registrations(local, client, n)
    regs = [Registry(cfgmod.Cluster(redis_url=redis_url, lease_s=5, replica_id=f"{client}-{i}")) for i in range(2)]
    sups = [SharedSupersede(r) for r in regs]
    try:
        for r, s in zip(regs, sups):
            await r.start()
            if not r.ok:
                raise RuntimeError(f"cannot reach Redis at {r.where}: {r.last_error}")
            await s.start()
        await _registrations(sups[0], client, min(n, 100))
        shared_s = await _registrations(sups[0], client, n)
        cancel_s = await _cancels(sups[0], sups[1], client, n)
    finally:
        for r, s in zip(regs, sups):
            await s.close()
            await r.close()
    return {"register": {"in_process": _stats(local_s), "redis": _stats(shared_s)},
            "cross_replica_cancel": {"redis": _stats(cancel_s)}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.supersede", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", help="default: start a throwaway redis-server on a free loopback port")
    p.add_argument("--n", type=int, default=1000, help="samples of each (default 1000)")
    args = p.parse_args(argv)
    server = None if args.redis_url else _ThrowawayRedis()
    try:
        result = asyncio.run(compare(args.redis_url or server.url, args.n))
    finally:
        if server is not None:
            server.close()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
