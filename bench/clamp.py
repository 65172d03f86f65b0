"""`python -m bench.clamp`: what fitting `max_tokens` to the context costs per request.

Claude Code asks for `max_tokens: 128000` on every turn. Three gateways in front of one vLLM
stub (32k context), each sent the same Claude Code-sized prompt (~60 kB, ~12k stub tokens):
  - `tokenizer`: kind vllm, the clamp counts the prompt with the stub's /tokenize, first time;
  - `estimate+retry`: kind openai (no tokenizer), the low estimate is refused and retried, which
    is what every Claude Code turn cost on vLLM before;
  - `no clamp`: `max_tokens: 16`, nothing to fit (the floor).
Whole (non-streaming) requests, one at a time, interleaved; medians and p90 of the wall time,
and how many chat requests reached the stub per client request. Loopback only, bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

import yaml

from .procs import Proc, workdir

CTX = 32768
PROMPT = "word " * 12_000 + "[stub reasoning=0 content=2]"


def _gateway(wd: str, stub_url: str, name: str, kind: str) -> Proc:
    cfg = {"backends": {"stub": {"url": stub_url + "/v1", "kind": kind, "slots": 4}},
           "models": {"m": {"backend": "stub", "upstream_model": "m", "max_model_len": CTX}},
           "access_log": os.path.join(wd, f"{name}-access.log"),
           "usage": {"path": os.path.join(wd, f"{name}-usage.sqlite3")}}  # not the user's ledger
    path = os.path.join(wd, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], wd)


def _post(url: str, body: dict) -> float:
    req = urllib.request.Request(url + "/llm/v1/messages", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        assert resp.status == 200
    return time.perf_counter() - t0


def _stub_total(stub_url: str) -> int:
    with urllib.request.urlopen(stub_url + "/stub/stats", timeout=5) as resp:
        return json.loads(resp.read())["total"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=40, help="requests per variant")
    args = ap.parse_args()
    wd = workdir()
    stub = Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", "0",
                         "--model", "m", "--max-model-len", str(CTX), "--token-delay-ms", "0"], wd)
    procs = [stub]
    try:
        tok = _gateway(wd, stub.url, "tokenizer", "vllm")
        est = _gateway(wd, stub.url, "estimate", "openai")
        procs += [tok, est]
        variants = [("tokenizer", tok.url, 128000), ("estimate+retry", est.url, 128000), ("no clamp", tok.url, 16)]
        times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        upstream: dict[str, int] = {name: 0 for name, _, _ in variants}
        for name, url, mt in variants:  # warm-up: connections, imports, caches
            _post(url, {"model": "m", "max_tokens": mt, "messages": [{"role": "user", "content": PROMPT}]})
        for _ in range(args.n):
            for name, url, mt in variants:
                before = _stub_total(stub.url)
                times[name].append(_post(url, {"model": "m", "max_tokens": mt,
                                               "messages": [{"role": "user", "content": PROMPT}]}))
                upstream[name] += _stub_total(stub.url) - before
        print(f"prompt {len(PROMPT)} bytes, context {CTX}, n={args.n} per variant")
        print("| variant | median ms | p90 ms | upstream chat requests per request |")
        print("|---|---|---|---|")
        for name, _, _ in variants:
            t = sorted(times[name])
            p90 = t[int(0.9 * (len(t) - 1))]
            print(f"| {name} | {statistics.median(t) * 1000:.1f} | {p90 * 1000:.1f} | {upstream[name] / args.n:.2f} |")
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
