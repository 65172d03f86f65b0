"""`python -m bench.typist`: a simulated typist and latest-wins completion (`supersede`).

An editor sends a completion at every pause in typing: here 15 requests 100 ms apart, each a
40-token completion (streamed, as Continue and llama.vscode's OpenAI mode do) of a backend that
generates a token every 20 ms (a 40-token answer takes 0.8 s) and runs `--slots` sequences at a
time. Only the last answer is wanted: every token generated for an earlier one is generated for
nothing. For each way of getting there, the figures are the tokens the backend generated for
nothing (its own log: `completed ... tokens=N` and `cancelled ... after N tokens`) and the latency
of the last request, from its send to its last byte (what the user waits for):

* direct, no abort: straight to the backend, the editor never aborts (many do not);
* direct, abort: straight to the backend, each keystroke aborts the previous request (Continue);
* gateway: through the gateway without `supersede`, no abort;
* gateway + supersede: the model has `supersede: true`, no abort;
* gateway + supersede, abort.

The stub runs as many sequences as it is sent (it models no shared compute), so straight to it
the requests do not queue: `direct` gets `--slots` only through the gateway. A real server with
`--slots` sequences queues or slows the rest; the direct figures are the best case for direct.
Loopback only, bounded (each scenario ends when its last answer does, at most `--timeout` s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import yaml

from .procs import Proc, workdir

KEYSTROKES = 15
GAP_S = 0.1
TOKENS = 40
TOKEN_MS = 20


class _Request(threading.Thread):
    def __init__(self, url: str, path: str, prompt: str) -> None:
        super().__init__(daemon=True)
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.path = path
        self.body = json.dumps({"model": "coder", "prompt": prompt, "max_tokens": TOKENS, "stream": True,
                                "temperature": 0.2}).encode()
        self.sent = self.done = 0.0
        self.complete = False

    def run(self) -> None:
        self.sent = time.monotonic()
        try:
            self.conn.request("POST", self.path, self.body, {"content-type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
            self.complete = resp.status == 200 and b"[DONE]" in data
        except (OSError, http.client.HTTPException):
            pass
        self.done = time.monotonic()

    def abort(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_LINE = re.compile(r"^(completed|cancelled) id=\S+ (?:tokens=|after )(\d+).* seq=(\d+)$")


def _tokens(log: str, since: int) -> dict[int, int]:
    """seq -> tokens generated, from the stub's log lines after byte `since`."""
    with open(log) as f:
        f.seek(since)
        out = {}
        for line in f:
            m = _LINE.match(line.strip())
            if m:
                out[int(m.group(3))] = int(m.group(2))
        return out


def _scenario(url: str, path: str, log: str, abort: bool, timeout: float) -> dict:
    since = os.path.getsize(log)
    reqs: list[_Request] = []
    for i in range(KEYSTROKES):
        r = _Request(url, path, f"def f{i}(x):\n    return")
        if abort and reqs:
            reqs[-1].abort()
        r.start()
        reqs.append(r)
        if i < KEYSTROKES - 1:
            time.sleep(GAP_S)
    last = reqs[-1]
    last.join(timeout)
    for r in reqs:
        r.abort()
        r.join(5)
    deadline = time.monotonic() + 10  # the backend's log: every request it got has ended
    while time.monotonic() < deadline:
        got = _tokens(log, since)
        text = open(log).read()[since:]
        if text.count("request id=") == len(got):
            break
        time.sleep(0.05)
    got = _tokens(log, since)
    wasted = sum(n for seq, n in got.items() if seq != max(got)) if got else 0
    return {"wasted_tokens": wasted, "reached_backend": len(got), "last_latency_s": round(last.done - last.sent, 3),
            "last_complete": last.complete}


def _gateway(wd: str, stub_url: str, slots: int, supersede: bool, name: str) -> Proc:
    cfg = {"backends": {"stub": {"url": stub_url + "/v1", "kind": "vllm", "slots": slots,
                                 "queue": {"depth": 64, "timeout_s": 60}}},
           "models": {"coder": {"backend": "stub", "supersede": supersede}},
           "access_log": os.path.join(wd, f"{name}-access.log"),
           "usage": {"path": os.path.join(wd, f"{name}-usage.sqlite3")}}
    path = os.path.join(wd, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], wd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.typist", description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=1, help="sequences the backend runs at once (through the gateway)")
    ap.add_argument("--timeout", type=float, default=30.0, help="longest wait for the last answer of a scenario")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    wd = workdir()
    log = os.path.join(wd, "stub.log")
    stub = Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--port", "0", "--model", "coder",
                         "--token-delay-ms", str(TOKEN_MS), "--log", log], wd)
    procs = [stub]
    rows = {}
    try:
        plain = _gateway(wd, stub.url, args.slots, False, "gateway")
        latest = _gateway(wd, stub.url, args.slots, True, "gateway-supersede")
        procs += [plain, latest]
        for label, url, path, abort in [
            ("direct, no abort", stub.url, "/v1/completions", False),
            ("direct, abort", stub.url, "/v1/completions", True),
            ("gateway", plain.url, "/v1/completions", False),
            ("gateway + supersede", latest.url, "/v1/completions", False),
            ("gateway + supersede, abort", latest.url, "/v1/completions", True),
        ]:
            rows[label] = _scenario(url, path, log, abort, args.timeout)
    finally:
        for p in reversed(procs):
            p.stop()
    if args.json:
        print(json.dumps({"keystrokes": KEYSTROKES, "gap_s": GAP_S, "tokens": TOKENS, "token_ms": TOKEN_MS,
                          "slots": args.slots, "results": rows}, indent=2))
        return 0
    print(f"{KEYSTROKES} completions {GAP_S * 1000:.0f} ms apart, {TOKENS} tokens each at {TOKEN_MS} ms/token, "
          f"{args.slots} slot(s) through the gateway")
    print(f"{'scenario':28s} {'wasted tokens':>14s} {'reached backend':>16s} {'last latency s':>15s}")
    for label, r in rows.items():
        mark = "" if r["last_complete"] else "  (last answer incomplete)"
        print(f"{label:28s} {r['wasted_tokens']:14d} {r['reached_backend']:16d} {r['last_latency_s']:15.3f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
