"""`python -m bench.prompt_count`: what the prompt count beside the upstream call costs TTFT.

One llama.cpp-flavoured stub and two gateways in front of it, alike but for one thing: in one the
exchange counts the prompt with the backend's tokenizer (/apply-template + /tokenize) beside the
upstream call, as every Anthropic stream on llama.cpp does (request/exchange.py `count_prompt`);
in the other that count is switched off (the exchange method replaced, in this benchmark's child
only). The same Anthropic streaming load goes through each, interleaved over repetitions, at
concurrency 1 and 4 (the gateway's 4 slots full); the report is each one's median TTFT p50 and
the difference. `--llama` runs the same against llama.cpp's real llama-server with Gemma 3 270M
(from `.ci/deps/llama-cpp.sh`), where the count has a real prefill to run beside. (No direct baseline: the stub, like llama.cpp, closes some connections after a
stream, which the load generator's keep-alive workers count as errors.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from . import procs
from .run import CLIENT_MODEL, UPSTREAM_MODEL

# No wait before the first token: the count has no prefill to hide in, the worst case for it. (A
# stub `ttft_ms` cannot stand in for a prefill here: the llama.cpp stub closes a connection 50 ms
# after a stream, which cuts a longer answer sent on that reused connection, with or without the
# count.)
PROMPT = "Tell me about the gateway and its slots, in a few words please. [stub content=20]"
_NO_COUNT = ("import sys; from homelab_frontend.request.exchange import Exchange; "
             "Exchange.count_prompt = lambda self, payload: False; "
             "from homelab_frontend.cli import main; sys.exit(main(sys.argv[1:]))")


LLAMA_HOME = Path(os.environ.get("HLF_LLAMA_HOME", Path.home() / ".cache" / "homelab-frontend" / "llama.cpp"))
LLAMA_VERSION = "11434.0.0"  # as tests/llamaproc.py
TEMPLATE = Path(__file__).resolve().parents[1] / "tests" / "real" / "gemma3.jinja"


def _llama_server(wd: str, slots: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(wd, "llama-server.log"), "wb")
    proc = subprocess.Popen(
        [str(LLAMA_HOME / LLAMA_VERSION / "bin" / "llama-server"), "-m",
         str(LLAMA_HOME / "models" / "gemma-3-270m-q4_k_m.gguf"), "--alias", UPSTREAM_MODEL,
         "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots), "-c", str(1024 * slots),
         "-t", "1", "-tb", "1", "--metrics", "--jinja", "--chat-template-file", str(TEMPLATE), "--no-warmup"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not start")


def _gateway(wd: str, name: str, stub_url: str, count: bool) -> procs.Proc:
    cfg = {"backends": {"stub": {"url": stub_url + "/v1", "kind": "llamacpp", "slots": 4,
                                 "queue": {"depth": 256, "timeout_s": 60}}},
           "models": {CLIENT_MODEL: {"backend": "stub", "upstream_model": UPSTREAM_MODEL}},
           "access_log": os.path.join(wd, f"{name}-access.log")}
    path = os.path.join(wd, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    head = [sys.executable, "-m", "homelab_frontend"] if count else [sys.executable, "-c", _NO_COUNT]
    return procs.Proc(name, [*head, "serve", "--config", path, "--port", "0"], wd)


def _spec(url: str, path: str, body: dict, dialect: str, c: int, n: int) -> dict:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return {"host": host, "port": int(port), "path": path, "body": json.dumps(body),
            "headers": {"anthropic-version": "2023-06-01"}, "stream": True, "dialect": dialect,
            "concurrency": c, "requests": n, "warmup": 2 * c, "timeout_s": 60.0, "request_timeout_s": 15.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.prompt_count", description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, help="timed requests per repetition and cell (default 150, --llama 15)")
    ap.add_argument("--llama", action="store_true", help="against the real llama-server (Gemma 3 270M)")
    args = ap.parse_args(argv)
    if args.requests is None:
        args.requests = 15 if args.llama else 150
    wd = procs.workdir()
    stub = on = off = load = llama = None
    prompt = PROMPT.split(" [stub")[0] if args.llama else PROMPT
    ant = {"model": CLIENT_MODEL, "max_tokens": 8 if args.llama else 64, "stream": True,
           "messages": [{"role": "user", "content": prompt}]}
    out: dict[str, dict[int, list[float]]] = {"count on": {}, "count off": {}}
    errors = {"count on": 0, "count off": 0}
    try:
        if args.llama:
            llama, url = _llama_server(wd, 4)
        else:
            stub = procs.Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "llamacpp",
                                       "--port", "0", "--model", UPSTREAM_MODEL, "--max-model-len", "8192"], wd)
            url = stub.url
        on, off = _gateway(wd, "count-on", url, True), _gateway(wd, "count-off", url, False)
        time.sleep(1.0)  # kind detection and the first health probe
        load = procs.LoadGen()
        for _ in range(args.reps):
            for c in (1, 4):
                cells = (("count on", on.url, "/llm/v1/messages", ant, "anthropic"),
                         ("count off", off.url, "/llm/v1/messages", ant, "anthropic"))
                for name, url, path, body, dialect in cells:
                    res = load.run(_spec(url, path, body, dialect, c, args.requests))
                    errors[name] += res["errors"]
                    out[name].setdefault(c, []).append(res["ttft_p50_ms"])
    finally:
        for p in (load, off, on, stub):
            if p is not None:
                p.stop()
        if llama is not None:
            llama.kill()
            llama.wait()
    where = "the real llama-server (Gemma 3 270M, CPU)" if args.llama else "the llama.cpp stub"
    print(f"TTFT p50 (ms), Anthropic stream on {where}, median of {args.reps} reps x {args.requests}:")
    for c in (1, 4):
        a, b = (statistics.median(out[k][c]) for k in ("count on", "count off"))
        print(f"  c={c}: count off {b:6.2f}   count on {a:6.2f}   on-off {a - b:+6.2f}"
              f"   reps on {[round(x, 2) for x in out['count on'][c]]} off {[round(x, 2) for x in out['count off'][c]]}")
    print(f"  failed requests: {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
