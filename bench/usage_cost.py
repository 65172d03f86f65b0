"""`python -m bench.usage_cost`: what the usage ledger and (off) tracing add per request, measured
in-process where the whole-gateway benchmark (`bench.run --ledger on|off`) cannot resolve it on a
busy machine.

- on the event loop: `Ledger.record(t)` for one finished request record (the entry read off the
  record, the budget count, a queue append);
- on the writer thread: its CPU per request, writing batches of upserts to a SQLite file;
- tracing off: the checks on the request path (`gw.tracing is None` at arrival, `t.trace is
  None` at the upstream call and at the end).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
import timeit

from homelab_frontend import config as cfgmod
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.usage import Ledger

N = 50_000


def _record(i: int) -> Tracked:
    t = Tracked(f"req_{i}", "openai", f"m{i % 3}", f"key{i % 5}", True)
    t.upstream_model, t.backend, t.tokens_in, t.tokens_out, t.tokens_cached = "up", "gpu0", 1200, 200, 800
    t.slot_seconds, t.queue_wait, t.upstream_headers = 2.5, 0.01, 0.02
    return t


async def _checks_cost() -> float:
    ns = type("G", (), {"tracing": None})()
    t = _record(0)
    checks = timeit.timeit(lambda: (ns.tracing is not None, t.trace is not None, t.trace is not None), number=1_000_000)
    empty = timeit.timeit(lambda: None, number=1_000_000)
    return checks - empty


async def _ledger_cost(path: str) -> tuple[float, float]:
    cfg = cfgmod.parse({"usage": {"path": path}})
    ledger = Ledger(cfg)
    records = [_record(i) for i in range(N)]
    ledger.record(records[0])
    await ledger.query()  # the thread is up, the file made
    store = ledger.store
    thread = store._thread
    t0 = time.perf_counter()
    for t in records:
        ledger.record(t)
    on_loop = (time.perf_counter() - t0) / N
    # the writer's own CPU: its thread's clock, read on the thread at the end
    got: dict = {}
    await store._run(lambda db: got.setdefault("cpu", time.thread_time()))
    await ledger.close()
    assert thread is not None
    return on_loop, got["cpu"] / (N + 1)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        on_loop, writer = asyncio.run(_ledger_cost(os.path.join(d, "usage.sqlite3")))
    checks = asyncio.run(_checks_cost())
    print(f"ledger, on the event loop:   {on_loop * 1e6:6.2f} us per request ({N} requests)")
    print(f"ledger, on its writer thread: {writer * 1e6:6.2f} us CPU per request (batched upserts, SQLite WAL)")
    print(f"tracing off, request path:   {checks * 1e3:6.1f} ns per request (three None checks)")
    print(f"threads: {threading.active_count()} left running")


if __name__ == "__main__":
    main()
