"""`python -m bench.cluster`: what sharing slots through Redis adds, against the in-process pool.

One stub upstream, one throwaway `redis-server` on a free loopback port, and two gateways in front
of the same stub: one with the in-process slot pool, one with `cluster:` (Redis leases). The same
c=1 streaming load (OpenAI surface, 200 tokens per answer) goes through each, interleaved over
several repetitions; the report is the time to first token through each and the difference.
The slot pools are also compared alone (`bench.slots`: take-and-give-back cycles,
and the hand-off of a freed slot to a request queued on another replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import yaml

from . import procs
from .run import CLIENT_MODEL, UPSTREAM_MODEL, client_body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(workdir: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.02)


def _gateway(workdir: str, name: str, stub_url: str, cluster: dict | None) -> procs.Proc:
    cfg: dict = {
        "backends": {"stub": {"url": stub_url + "/v1", "kind": "vllm", "slots": 64}},
        "models": {CLIENT_MODEL: {"backend": "stub", "upstream_model": UPSTREAM_MODEL}},
        "access_log": os.path.join(workdir, f"{name}-access.log"),
        "usage": {"path": os.path.join(workdir, f"{name}-usage.sqlite3")},  # not the user's ledger
    }
    if cluster:
        cfg["cluster"] = cluster
    path = os.path.join(workdir, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return procs.Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"],
                      workdir)


def _spec(gw: procs.Proc, requests: int) -> dict:
    host, port = gw.url.split("//", 1)[1].rsplit(":", 1)
    return {"host": host, "port": int(port), "path": "/llm/v1/chat/completions",
            "body": json.dumps(client_body("openai", True)), "headers": {}, "stream": True,
            "dialect": "openai", "concurrency": 1, "requests": requests, "warmup": 20,
            "timeout_s": 30.0, "request_timeout_s": 15.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="timed requests per repetition")
    args = ap.parse_args(argv)
    if shutil.which("redis-server") is None:
        print("bench.cluster needs redis-server (Debian: apt-get install redis-server)", file=sys.stderr)
        return 2
    wd = procs.workdir()
    redis, url = _start_redis(wd)
    stub = local = shared = load = None
    try:
        stub = procs.start_stub(wd, UPSTREAM_MODEL)
        local = _gateway(wd, "in-process", stub.url, None)
        shared = _gateway(wd, "redis", stub.url, {"redis_url": url, "lease_s": 2})
        time.sleep(1.5)  # a fresh cluster grants nothing for its discovery window (README: several replicas)
        load = procs.LoadGen()
        ttft: dict[str, list[float]] = {"in-process": [], "redis": []}
        for _ in range(args.reps):
            for name, gw in (("in-process", local), ("redis", shared)):
                res = load.run(_spec(gw, args.requests))
                ttft[name].append(res["ttft_p50_ms"])
        from bench.slots import compare

        pools = asyncio.run(compare(url, n=1000))
    finally:
        for p in (load, shared, local, stub):
            if p is not None:
                p.stop()
        redis.terminate()
        redis.wait(5)
    a, b = statistics.median(ttft["in-process"]), statistics.median(ttft["redis"])
    print(f"time to first token, c=1 stream, p50 over {args.reps} reps of {args.requests}:")
    print(f"  in-process pool  {a:7.3f} ms   {ttft['in-process']}")
    print(f"  Redis leases     {b:7.3f} ms   {ttft['redis']}")
    print(f"  added by Redis   {b - a:7.3f} ms")
    acq = pools["acquire"]
    print(f"slot take+give back alone: in-process p50 {acq['in_process']['p50_ms']:.4f} ms, "
          f"Redis p50 {acq['redis']['p50_ms']:.3f} ms / p99 {acq['redis']['p99_ms']:.3f} ms; "
          f"freed slot to a waiter on another replica p50 {pools['handoff']['redis']['p50_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
