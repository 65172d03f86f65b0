"""`python -m bench.profile`: where the gateway's CPU goes under one benchmark load.

Starts the stub and the gateway as `bench.run` does, attaches py-spy (`pip install py-spy`) to
the gateway, drives one load (surface, streaming or not, concurrency) for a number of requests,
and writes the samples in collapsed-stack form (one line per stack, `frame;frame;... count`)
under bench/results/ (flamegraph.pl or speedscope read it). It then prints the functions with the
most samples, by own time and by time including callees.

    python -m bench.profile --surface anthropic --stream --concurrency 16 --requests 3000
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .run import RESULTS, Bench


def top(collapsed: Path, n: int = 25) -> tuple[list, list, int]:
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        samples += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    return own.most_common(n), total.most_common(n), samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--surface", choices=("openai", "anthropic"), default="openai")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    bargs = argparse.Namespace(quick=True, surfaces=(args.surface,), queue_check=False, litellm=False, floor=False,
                               concurrency=(args.concurrency,), reps=1)
    bench = Bench(bargs)
    stamp = f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    name = f"profile-{args.surface}-{'stream' if args.stream else 'plain'}-c{args.concurrency}-{stamp}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    collapsed = RESULTS / f"{name}.txt"
    try:
        bench.start()
        gw = bench.targets["gateway"]
        spec = bench.spec("gateway", args.surface, args.stream, args.concurrency, args.requests)
        spec["timeout_s"] = 120.0
        rec = subprocess.Popen([spy, "record", "--pid", str(gw.pid), "--rate", str(args.rate), "--format", "raw",
                                "--output", str(collapsed), *(["--native"] if args.native else [])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches
        c0 = gw.cpu()
        res = bench.load.run(spec)
        cpu = gw.cpu() - c0
        rec.send_signal(2)  # SIGINT: py-spy writes its output and exits
        rec.wait(30)
    finally:
        bench.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    print(f"{res.get('ok')} requests ok, {res.get('errors')} errors, {res.get('req_per_s') or 0:.0f} req/s, "
          f"{res.get('chunks_per_s') or 0:.0f} chunks/s; gateway cpu {cpu:.2f} s "
          f"({cpu / max(res.get('ok') or 1, 1) * 1e6:.0f} us/request"
          + (f", {cpu / res['chunks'] * 1e6:.1f} us/chunk)" if res.get("chunks") else ")"))
    if not collapsed.exists():
        print("py-spy wrote nothing:", rec.stderr.read().decode(errors="replace"), file=sys.stderr)
        return 1
    own, total, samples = top(collapsed)
    print(f"\n{samples} samples. Own time:")
    for f, k in own:
        print(f"  {100 * k / samples:5.1f}%  {f}")
    print("\nIncluding callees:")
    for f, k in total:
        print(f"  {100 * k / samples:5.1f}%  {f}")
    print(f"\nwrote {collapsed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
