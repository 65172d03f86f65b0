"""`make bench` / `python -m bench.run [--quick] [--floor] [--litellm]`: the gateway against its upstream.

One run starts a vLLM-flavoured stub (zero token delay, 200 content tokens per answer), the
gateway in front of it, and a load generator process, then measures the same answers twice:
straight from the stub ("direct") and through the gateway, for the OpenAI and the Anthropic
surfaces, non-streaming and streaming, at concurrency 1, 16 and 64. The direct request for a
surface is the very body the gateway sends upstream for it (read back from the stub), so both
sides of a ratio ask the stub for the same work. `--floor` adds a bare aiohttp relay
(bench/floor.py), `--litellm` LiteLLM's proxy when it is installed, both measured the same way.

Everything shares two cores (and, on a developer's machine, whatever else runs there), so each
cell is measured `--reps` times, direct and gateway back to back, and the report gives medians
of the per-repetition ratios with their spread. The JSON file keeps every raw measurement.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from . import procs
from .report import check_targets, print_report

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT_MODEL = "bench"
UPSTREAM_MODEL = "bench-upstream"
PROMPT = "[stub content=200]"  # the stub's directive: 200 content tokens, one per chunk
MAX_TOKENS = 400
CONCURRENCY = (1, 16, 64)
SURFACES = ("openai", "anthropic", "responses", "ollama", "gemini")

# Timed requests per run: about a second each on this machine; --quick halves them.
COUNTS = {
    ("plain", 1): 300, ("plain", 16): 800, ("plain", 64): 1280,
    ("stream", 1): 200, ("stream", 16): 320, ("stream", 64): 512,
}
PATHS = {"openai": "/llm/v1/chat/completions", "anthropic": "/llm/v1/messages", "responses": "/llm/v1/responses",
         "ollama": "/api/chat",
         "direct": "/v1/chat/completions", "litellm-openai": "/v1/chat/completions",
         "litellm-anthropic": "/v1/messages"}


def path_of(surface: str, stream: bool) -> str:
    if surface == "gemini":  # the model and the method are in the path
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/llm/v1beta/models/{CLIENT_MODEL}:{method}"
    return PATHS[surface]


def client_body(surface: str, stream: bool) -> dict:
    if surface == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
                "generationConfig": {"maxOutputTokens": MAX_TOKENS}}
    if surface == "responses":  # store: false, as Codex sends it: the store is not what is measured
        return {"model": CLIENT_MODEL, "max_output_tokens": MAX_TOKENS, "input": PROMPT, "store": False,
                "stream": stream}
    if surface == "ollama":  # stream is Ollama's default: always said, as its Python library does
        return {"model": CLIENT_MODEL, "options": {"num_predict": MAX_TOKENS}, "stream": stream,
                "messages": [{"role": "user", "content": PROMPT}]}
    body: dict = {"model": CLIENT_MODEL, "max_tokens": MAX_TOKENS,
                  "messages": [{"role": "user", "content": PROMPT}]}
    if stream:
        body["stream"] = True
    return body


def _hostport(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def _post(url: str, body: dict, headers: dict | None = None) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def upstream_body(gw: procs.Proc, stub: procs.Proc, surface: str, stream: bool) -> dict:
    """What the gateway sends the stub for this surface's request: the direct baseline."""
    _post(gw.url + path_of(surface, stream), client_body(surface, stream), {"anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(stub.url + "/stub/requests", timeout=10) as resp:
        return json.loads(resp.read())[-1]["body"]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scale = 0.5 if args.quick else 1.0
        self.runs: list[dict] = []
        self.workdir = procs.workdir()
        self.stub: procs.Proc | None = None
        self.targets: dict[str, procs.Proc] = {}
        self.load: procs.LoadGen | None = None
        self.memory: dict[str, dict] = {}
        self.notes: list[str] = []

    # -- processes ------------------------------------------------------------------------

    def start(self) -> None:
        self.stub = procs.start_stub(self.workdir, UPSTREAM_MODEL)
        gw = self.targets["gateway"] = procs.start_gateway(
            self.workdir, self.stub.url, CLIENT_MODEL, UPSTREAM_MODEL, slots=1024, ledger=self.args.ledger == "on")
        time.sleep(0.3)  # let start-up work (imports, the first health probe) settle
        self.memory["gateway_start"] = gw.memory()
        if self.args.queue_check:
            # Exactly enough slots for c=16: every slot busy, yet nobody should ever wait.
            self.targets["gateway-16slots"] = procs.start_gateway(
                self.workdir, self.stub.url, CLIENT_MODEL, UPSTREAM_MODEL, slots=16, name="gateway-16slots")
        if self.args.floor:
            self.targets["floor"] = procs.start_floor(self.workdir, self.stub.url)
        if self.args.litellm:
            if procs.litellm_command() is None:
                self.notes.append("--litellm: LiteLLM is not installed here (no `litellm` on PATH or "
                                  "$LITELLM_BIN): skipped")
                print(self.notes[-1], flush=True)
            else:
                print("starting LiteLLM's proxy (this takes a while)...", flush=True)
                try:
                    self.targets["litellm"] = procs.start_litellm(
                        self.workdir, self.stub.url, CLIENT_MODEL, UPSTREAM_MODEL)
                    self.memory["litellm_start"] = self.targets["litellm"].memory()
                except RuntimeError as err:
                    self.notes.append(f"--litellm: {err}")
                    print(self.notes[-1], flush=True)
        self.load = procs.LoadGen()
        self.bodies = {(s, stream): upstream_body(gw, self.stub, s, stream)
                       for s in self.surfaces for stream in (False, True)}

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        for p in self.targets.values():
            p.stop()
        if self.stub is not None:
            self.stub.stop()

    @property
    def surfaces(self) -> tuple[str, ...]:
        return tuple(s for s in SURFACES if s in self.args.surfaces)

    # -- one measurement ------------------------------------------------------------------

    def spec(self, target: str, surface: str, stream: bool, c: int, requests: int) -> dict:
        if target in ("direct", "floor"):
            # the floor relay forwards bytes as they are: it gets the upstream's own request
            url = self.stub.url if target == "direct" else self.targets[target].url
            path = PATHS["direct"] if target == "direct" else PATHS["openai"]
            body, dialect = self.bodies[(surface, stream)], "openai"
        else:
            url = self.targets[target].url
            path = PATHS[f"litellm-{surface}"] if target == "litellm" else path_of(surface, stream)
            body, dialect = client_body(surface, stream), surface
        host, port = _hostport(url)
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "unused"} if dialect == "anthropic" else {}
        if target == "litellm":
            headers["authorization"] = f"Bearer {procs.LITELLM_KEY}"
            if dialect == "anthropic":
                headers["x-api-key"] = procs.LITELLM_KEY
        return {"host": host, "port": port, "path": path, "body": json.dumps(body), "headers": headers,
                "stream": stream, "dialect": dialect, "concurrency": c, "requests": requests,
                "warmup": max(8, c * 2), "timeout_s": 20.0 if target != "litellm" else 60.0,
                "request_timeout_s": 15.0}

    def measure(self, rep: int, target: str, surface: str, stream: bool, c: int, label: str | None = None) -> dict:
        """One run; `label` files it under another name than the target's (queue check)."""
        mode = "stream" if stream else "plain"
        n = max(c, int(COUNTS[(mode, c)] * self.scale))
        if target == "litellm":
            n = max(c, n // 4)  # an order of magnitude slower: keep the run bounded
        spec = self.spec(target, surface, stream, c, n)
        watched = {"stub": self.stub, "loadgen": self.load}
        if target != "direct":
            watched["target"] = self.targets[target]
        before: dict[str, float] = {}
        t0 = [0.0]

        def on_warm() -> None:
            for k, p in watched.items():
                before[k] = procs.cpu_seconds(p.pid)
            t0[0] = time.monotonic()

        res = self.load.run(spec, on_warm=on_warm)
        wall = time.monotonic() - t0[0]
        cpu = {k: procs.cpu_seconds(p.pid) - before[k] for k, p in watched.items() if k in before}
        rec = {"rep": rep, "target": label or target, "surface": surface, "mode": mode, "concurrency": c, **res,
               "cpu_s": cpu, "cpu_wall_s": wall}
        if "target" in cpu and res.get("ok"):
            rec["target_cpu_us_per_req"] = cpu["target"] / res["ok"] * 1e6
            if stream and res.get("chunks"):
                rec["target_cpu_us_per_chunk"] = cpu["target"] / res["chunks"] * 1e6
        if target != "direct":
            rec["target_memory"] = self.targets[target].memory()
        self.runs.append(rec)
        self._progress(rec)
        return rec

    def _progress(self, r: dict) -> None:
        what = f"{r['target']:>15} {r['surface']:>9} {r['mode']:>6} c={r['concurrency']:<3}"
        if r.get("fatal"):
            print(f"  {what} FAILED: {r['fatal']}", flush=True)
            return
        rate = (f"{r['chunks_per_s']:>9.0f} chunks/s" if r["mode"] == "stream" and r.get("chunks_per_s")
                else f"{r.get('req_per_s') or 0:>9.1f} req/s   ")
        ttft = f" ttft p50 {r['ttft_p50_ms']:.2f} ms" if r.get("ttft_p50_ms") is not None else ""
        err = f"  ERRORS {r['errors']}: {r['error_examples']}" if r.get("errors") else ""
        print(f"  {what} {rate}{ttft}{err}", flush=True)

    # -- the plan -------------------------------------------------------------------------

    def run(self) -> dict:
        started = dt.datetime.now()
        t_start = time.monotonic()
        self.start()
        targets = [t for t in ("gateway", "floor", "litellm") if t in self.targets]
        reps = self.args.reps or (1 if self.args.quick else 3)
        for rep in range(reps):
            print(f"repetition {rep + 1}/{reps}", flush=True)
            for stream in (False, True):
                for c in self.args.concurrency:
                    for surface in self.surfaces:
                        self.measure(rep, "direct", surface, stream, c)
                        for target in targets:
                            if target == "floor" and surface != "openai":
                                continue  # the bare relay does not translate dialects
                            if target == "litellm" and surface in ("responses", "ollama"):
                                continue  # measured against LiteLLM for OpenAI and Anthropic only
                            self.measure(rep, target, surface, stream, c)
            if rep == 0:
                # idle after the first full pass: all code paths loaded, nothing in flight
                time.sleep(0.2)
                self.memory["gateway_idle"] = self.targets["gateway"].memory()
            if "gateway-16slots" in self.targets and 16 in self.args.concurrency and "openai" in self.surfaces:
                self.measure(rep, "gateway-16slots", "openai", True, 16, label="queue-16slots")
                self.measure(rep, "gateway", "openai", True, 16, label="queue-1024slots")
        self.memory["gateway_end"] = self.targets["gateway"].memory()
        if "litellm" in self.targets:
            self.memory["litellm_end"] = self.targets["litellm"].memory()
        return {
            "started": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t_start, 1),
            "machine": machine(),
            "settings": {"quick": self.args.quick, "ledger": self.args.ledger, "reps": reps, "concurrency": list(self.args.concurrency),
                         "surfaces": list(self.surfaces), "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                         "stub": "vllm flavour, zero token delay", "gateway_slots": 1024},
            "notes": self.notes,
            "memory_mb": self.memory,
            "summary": summarize(self.runs),
            "runs": self.runs,
        }


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "kernel": platform.release(), "loadavg_at_start": load}


# -- aggregation ------------------------------------------------------------------------------

_METRICS = ("req_per_s", "chunks_per_s", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms",
            "target_cpu_us_per_req", "target_cpu_us_per_chunk")


def _med(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict]) -> dict:
    """Per cell: medians (with min/max) of each metric, and gateway/direct ratios computed per
    repetition (direct and target measured back to back) and then reduced to their median."""
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        cells.setdefault((r["target"], r["surface"], r["mode"], r["concurrency"]), []).append(r)
    out: dict[str, dict] = {}
    for (target, surface, mode, c), rs in sorted(cells.items()):
        entry = {m: _med([r.get(m) for r in rs]) for m in _METRICS}
        entry["errors"] = sum(r.get("errors", 0) for r in rs)
        queue = [r["server_timing"]["queue"]["p99_ms"] for r in rs if r.get("server_timing", {}).get("queue")]
        entry["server_timing_queue_p99_ms"] = _med(queue)
        if target != "direct":
            direct = {r["rep"]: r for r in cells.get(("direct", surface, mode, c), [])}
            ratios: dict[str, list[float]] = {"req_per_s": [], "chunks_per_s": []}
            added: list[float] = []
            for r in rs:
                d = direct.get(r["rep"])
                if d is None:
                    continue
                for m in ratios:
                    if r.get(m) and d.get(m):
                        ratios[m].append(r[m] / d[m])
                if r.get("ttft_p50_ms") is not None and d.get("ttft_p50_ms") is not None:
                    added.append(r["ttft_p50_ms"] - d["ttft_p50_ms"])
            entry["ratio"] = {m: _med(v) for m, v in ratios.items()}
            entry["ttft_p50_added_ms"] = _med(added)
        out[f"{target}/{surface}/{mode}/c{c}"] = entry
    return out


def run_to_end(bench) -> dict | None:
    """`bench.run()` with its processes stopped however it ends, and a failure naming the folder of
    their logs. -> the result, None when interrupted (the caller exits 130)."""
    try:
        return bench.run()
    except KeyboardInterrupt:
        print(f"interrupted; the processes' logs are in {bench.workdir}", file=sys.stderr)
        return None
    except BaseException:
        print(f"the benchmark failed; the processes' logs are in {bench.workdir}", file=sys.stderr)
        raise
    finally:
        bench.stop()


def write_result(result: dict, path: str | None, prefix: str) -> Path:
    """Write the JSON result to `path`, default bench/results/<prefix>-<time>.json. -> where."""
    out = Path(path) if path else RESULTS / f"{prefix}-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one repetition, half the requests (~30 s)")
    p.add_argument("--reps", type=int, help="repetitions of every cell (default 3, --quick 1)")
    p.add_argument("--litellm", action="store_true", help="also measure LiteLLM's proxy, if installed")
    p.add_argument("--floor", action="store_true",
                   help="also measure a bare aiohttp relay (bench/floor.py): the cost of the hop alone")
    p.add_argument("--concurrency", type=lambda s: tuple(int(x) for x in s.split(",")), default=CONCURRENCY,
                   help="a subset of 1,16,64 (default all three)")
    p.add_argument("--surfaces", type=lambda s: tuple(s.split(",")), default=SURFACES,
                   help="openai,anthropic,responses,ollama,gemini (default all)")
    p.add_argument("--no-queue-check", dest="queue_check", action="store_false",
                   help="skip the exactly-enough-slots comparison")
    p.add_argument("--ledger", choices=("on", "off"), default="on",
                   help="the gateway's usage ledger (default on, as in production): off measures its cost")
    p.add_argument("--out", help="JSON result file (default bench/results/bench-<time>.json)")
    args = p.parse_args(argv)
    bad = [c for c in args.concurrency if c not in (1, 16, 64)]
    if bad:
        p.error(f"--concurrency: {bad} not in 1,16,64")
    unknown = [x for x in args.surfaces if x not in SURFACES]
    if unknown or not args.surfaces:
        p.error(f"--surfaces: {unknown or 'none'} not in openai,anthropic,responses,ollama,gemini")
    bench = Bench(args)
    result = run_to_end(bench)
    if result is None:
        return 130
    shutil.rmtree(bench.workdir, ignore_errors=True)  # logs and configs: only needed on failure
    result["targets"] = check_targets(result)
    out = write_result(result, args.out, "bench")
    print_report(result)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
