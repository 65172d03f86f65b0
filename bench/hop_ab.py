"""`python -m bench.hop_ab --base-src DIR [--surface S] [--stream]`: requests through the gateway at
another checkout and at this one, against the bare relay, paired.

The relay (bench/floor.py), a gateway running the code under DIR (e.g. `git archive <commit> | tar
-x -C /tmp/base`, then `--base-src /tmp/base/src`) and a gateway running this checkout stand in
front of one vLLM-flavoured stub; one surface's load (default the OpenAI surface, plain, c=16;
`--stream` streams 200 chunks an answer) goes through each in turn, `--reps` times interleaved, so
slow drifts of a shared machine hit all three alike. The relay gets the upstream's own request,
so it forwards the same work without translating. Reported per target: req/s and gateway CPU per
request (utime+stime over the timed requests), and for each gateway the medians of its
per-repetition ratios to the relay.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import yaml

from . import procs
from .run import CLIENT_MODEL, PATHS, SURFACES, UPSTREAM_MODEL, client_body, path_of, upstream_body

HERE_SRC = str(Path(__file__).resolve().parents[1] / "src")


def _gateway(wd: str, name: str, stub_url: str, src: str) -> procs.Proc:
    cfg = {"backends": {"stub": {"url": stub_url + "/v1", "kind": "vllm", "slots": 1024,
                                 "queue": {"depth": 1024, "timeout_s": 60}}},
           "models": {CLIENT_MODEL: {"backend": "stub", "upstream_model": UPSTREAM_MODEL}},
           "access_log": os.path.join(wd, f"{name}-access.log")}
    path = os.path.join(wd, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return procs.Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"],
                      wd, env={"PYTHONPATH": src})


def _spec(url: str, path: str, dialect: str, body: dict, stream: bool, n: int, c: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"} if dialect == "anthropic" else {}
    return {"host": host, "port": int(port), "path": path, "body": json.dumps(body),
            "headers": headers, "stream": stream, "dialect": dialect, "concurrency": c, "requests": n,
            "warmup": 4 * c, "timeout_s": 60.0, "request_timeout_s": 15.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hop_ab", description=__doc__)
    ap.add_argument("--base-src", required=True, help="the other checkout's src/ directory")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--surface", choices=SURFACES, default="openai")
    ap.add_argument("--stream", action="store_true", help="streamed answers (200 chunks each)")
    args = ap.parse_args(argv)
    wd = procs.workdir()
    stub = floor = base = here = load = None
    rps: dict[str, list[float]] = {"relay": [], "base": [], "this": []}
    cpu: dict[str, list[float]] = {"relay": [], "base": [], "this": []}
    try:
        stub = procs.start_stub(wd, UPSTREAM_MODEL)
        floor = procs.start_floor(wd, stub.url)
        base = _gateway(wd, "base", stub.url, args.base_src)
        here = _gateway(wd, "this", stub.url, HERE_SRC)
        load = procs.LoadGen()
        gw_body = client_body(args.surface, args.stream)
        gw_path = path_of(args.surface, args.stream)
        relay_body = upstream_body(here, stub, args.surface, args.stream)  # the upstream's own body
        targets = (("relay", floor, PATHS["openai"], "openai", relay_body),
                   ("base", base, gw_path, args.surface, gw_body), ("this", here, gw_path, args.surface, gw_body))
        for _ in range(args.reps):
            for name, p, path, dialect, body in targets:
                before: list[float] = []
                res = load.run(_spec(p.url, path, dialect, body, args.stream, args.requests, args.concurrency),
                               on_warm=lambda p=p: before.append(p.cpu()))
                if res["errors"]:
                    raise RuntimeError(f"{name}: {res['errors']} errors, e.g. {res['error_examples']}")
                rps[name].append(res["req_per_s"])
                cpu[name].append((p.cpu() - before[0]) / res["ok"] * 1e6)
    finally:
        for p in (load, here, base, floor, stub):
            if p is not None:
                p.stop()
    print(f"{args.surface} {'stream' if args.stream else 'plain'}, c={args.concurrency}, {args.reps} interleaved repetitions of {args.requests} requests")
    for name in rps:
        print(f"  {name:6} req/s {[round(x) for x in rps[name]]}  cpu us/req {[round(x) for x in cpu[name]]}")
    for name in ("base", "this"):
        r = [g / f for g, f in zip(rps[name], rps["relay"])]
        c = [g / f for g, f in zip(cpu[name], cpu["relay"])]
        print(f"  {name}: req/s / relay median {statistics.median(r):.3f} ({min(r):.2f}-{max(r):.2f}); "
              f"cpu/req / relay median {statistics.median(c):.2f}; cpu us/req median {statistics.median(cpu[name]):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
