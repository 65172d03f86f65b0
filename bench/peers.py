"""`python -m bench.peers [--reps 3] [--tokens 100] [--token-delay-ms 10]`: a stream's first token
and tokens/s through a front gateway and its peer box (two hops) against the box alone.

One vLLM-flavoured stub generating `--tokens` tokens at `--token-delay-ms` each (a model server's
pace; zero would measure only the gateways' CPU on a shared two-core machine), the box's gateway
in front of it (a key marked `peer` for the front, as docs/several-boxes.md configures it), and a
front gateway whose only backend is the box (`kind: peer`, no models). The same OpenAI streaming
request goes to the box and to the front in turn, at concurrency 1 and 8, `--reps` times
interleaved (who goes first alternates). Reported: medians of the per-repetition ratios front/box
of time to first token (lower is better) and of tokens/s (higher is better; aim >= 0.98).
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

from . import procs

MODEL = "bench"
UPSTREAM = "bench-upstream"
KEY = "sk-bench-front"
CONCURRENCY = (1, 8)


def _write(workdir: str, name: str, cfg: dict) -> str:
    path = os.path.join(workdir, f"{name}.yaml")
    cfg = {**cfg, "access_log": os.path.join(workdir, f"{name}-access.log"),
           "usage": {"path": os.path.join(workdir, f"{name}-usage.sqlite3")}}
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return path


def start(workdir: str, args: argparse.Namespace) -> dict[str, procs.Proc]:
    stub = procs.Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", "0",
                               "--model", UPSTREAM, "--max-model-len", "8192",
                               "--token-delay-ms", str(args.token_delay_ms)], workdir)
    env = {"HLF_BENCH_PEER_KEY": KEY}
    box_cfg = {"backends": {"gpu0": {"url": stub.url + "/v1", "kind": "vllm", "slots": 16}},
               "models": {MODEL: {"backend": "gpu0", "upstream_model": UPSTREAM}},
               "auth": {"keys": [{"name": "front", "key_env": "HLF_BENCH_PEER_KEY", "peer": True}]}}
    box = procs.Proc("box", [sys.executable, "-m", "homelab_frontend", "serve", "--config",
                             _write(workdir, "box", box_cfg), "--port", "0"], workdir, env=env)
    front_cfg = {"backends": {"box": {"url": box.url + "/llm/v1", "kind": "peer",
                                      "api_key_env": "HLF_BENCH_PEER_KEY", "health_interval_s": 1}}}
    front = procs.Proc("front", [sys.executable, "-m", "homelab_frontend", "serve", "--config",
                                 _write(workdir, "front", front_cfg), "--port", "0"], workdir, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the front has read the box's models
        with urllib.request.urlopen(front.url + "/llm/v1/models", timeout=5) as r:
            if json.loads(r.read())["data"]:
                break
        time.sleep(0.1)
    else:
        raise RuntimeError("the front never listed the box's model")
    return {"stub": stub, "box": box, "front": front}


def spec(url: str, c: int, n: int, tokens: int, headers: dict) -> dict:
    host, port = url.split("//", 1)[1].split(":")
    body = {"model": MODEL, "stream": True, "max_tokens": tokens + 10,
            "messages": [{"role": "user", "content": f"[stub content={tokens}] go"}]}
    return {"host": host, "port": int(port), "path": "/llm/v1/chat/completions", "body": json.dumps(body),
            "headers": headers, "stream": True, "dialect": "openai", "count_reasoning": True, "concurrency": c,
            "requests": n, "warmup": 0, "timeout_s": 600.0, "request_timeout_s": 120.0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--token-delay-ms", type=int, default=10)
    p.add_argument("--requests", type=int, default=16, help="timed requests per cell (per concurrency level: x c/1)")
    args = p.parse_args(argv)
    workdir = procs.workdir()
    running = start(workdir, args)
    load = procs.LoadGen()
    direct_headers = {"Authorization": f"Bearer {KEY}"}  # the box as the front reaches it, less the hop
    ratios: dict[int, dict[str, list[float]]] = {c: {"ttft": [], "tps": []} for c in CONCURRENCY}
    raw = []
    try:
        for target in ("box", "front"):  # warm-up
            load.run(spec(running[target].url, 1, 2, args.tokens, direct_headers if target == "box" else {}))
        for rep in range(args.reps):
            for c in CONCURRENCY:
                got = {}
                order = ("box", "front") if rep % 2 == 0 else ("front", "box")
                for target in order:
                    n = max(c, args.requests * max(1, c // 2))
                    res = load.run(spec(running[target].url, c, n, args.tokens,
                                        direct_headers if target == "box" else {}))
                    if res.get("fatal") or res.get("errors"):
                        raise RuntimeError(f"{target} c={c}: {res.get('fatal') or res.get('error_examples')}")
                    got[target] = res
                    raw.append({"rep": rep, "target": target, "concurrency": c, **res})
                    print(f"  rep {rep + 1} c={c} {target:>5}: ttft p50 {res['ttft_p50_ms']:7.1f} ms  "
                          f"{res['chunks_per_s']:8.1f} tokens/s", flush=True)
                ratios[c]["ttft"].append(got["front"]["ttft_p50_ms"] / got["box"]["ttft_p50_ms"])
                ratios[c]["tps"].append(got["front"]["chunks_per_s"] / got["box"]["chunks_per_s"])
    finally:
        load.stop()
        for proc in reversed(list(running.values())):
            proc.stop()
    print(f"\nfront (two hops) / box alone, medians of {args.reps} repetitions "
          f"({args.tokens} tokens at {args.token_delay_ms} ms each):")
    for c in CONCURRENCY:
        print(f"  c={c}: time to first token x{statistics.median(ratios[c]['ttft']):.3f}   "
              f"tokens/s x{statistics.median(ratios[c]['tps']):.3f}")
    out = os.path.join(workdir, "peers.json")
    with open(out, "w") as f:
        json.dump({"args": vars(args), "ratios": ratios, "runs": raw}, f, indent=1)
    print(f"raw figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
