"""`homelab-frontend demo`: the gateway on 127.0.0.1:8080 in front of two stand-in backends.

- `reasoning` on a vLLM-flavoured stub (deepseek_r1-style reasoning, log /tmp/stub-reasoning.log,
  emptied at start so `grep -c cancelled` counts this run only);
- `qwen2.5:3b-instruct` on an Ollama-flavoured stub;
- Claude Code's and Gemini CLI's model names aliased onto them.
Tokens come every 20 ms; a prompt of `long` keeps generating for several seconds. Ctrl-C stops all.

The demo touches nothing of a real gateway's: its config, usage ledger and stored Responses live in
a throwaway directory (`homelab-frontend-demo-*` under $TMPDIR), removed when it ends, by Ctrl-C,
SIGTERM or a failed start alike. A demo that cannot have its port says so before it touches any
file, so a second `make demo` leaves the first one's stub log alone.

Only glue (processes started and stopped): tests/integration/test_seed_verify.py runs it as a
user would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# /tmp, as the seed's Verify commands read it; HLF_DEMO_LOG_DIR moves both logs (the test suite
# gives each run its own directory, so that two runs on one machine do not count each other's)
LOG_DIR = os.environ.get("HLF_DEMO_LOG_DIR") or "/tmp"
REASONING_LOG = os.path.join(LOG_DIR, "stub-reasoning.log")
OLLAMA_LOG = os.path.join(LOG_DIR, "stub-ollama.log")

CONFIG = """\
# Written by `homelab-frontend demo`; edit and send SIGHUP to the gateway to reload.
listen: {{host: {host}, port: {port}}}
backends:
  gpu0:
    url: http://127.0.0.1:{vllm_port}/v1
    kind: vllm
    slots: 8
  ollama:
    url: http://127.0.0.1:{ollama_port}/v1
    kind: ollama
    slots: 4
models:
  reasoning:
    backend: gpu0
    upstream_model: deepseek-ai/DeepSeek-R1-Distill-Qwen-32B
    capabilities: [completion, tools, thinking]  # vLLM does not say what its model can do
  qwen2.5:3b-instruct:
    backend: ollama
aliases:
  "claude-*haiku*": qwen2.5:3b-instruct
  "claude-*": reasoning
  "gemini-*flash*": qwen2.5:3b-instruct
  "gemini-*pro*": reasoning
usage: {{path: {usage}}}
responses: {{store: {{path: {responses}}}}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stub(flavour: str, port: int, log: str, delay_ms: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "homelab_frontend.stub", "--flavour", flavour, "--port", str(port),
         "--log", log, "--token-delay-ms", str(delay_ms), *extra],
        stdout=subprocess.DEVNULL,
    )


def _wait_port(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def run(args: argparse.Namespace) -> int:
    from . import serve

    try:
        serve.check_port(args.host, args.port)  # before any file is touched (another demo's log)
    except serve.StartupError as err:
        return serve.fail(str(err))
    # SIGTERM ends the demo as Ctrl-C does, through the cleanup below (serve handles both itself
    # while it runs; this covers the stubs' start before it and the stop after it)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    state = tempfile.mkdtemp(prefix="homelab-frontend-demo-")
    stubs: list[subprocess.Popen] = []
    try:
        return _run(args, state, stubs)
    except KeyboardInterrupt:
        return 130
    finally:
        # a second Ctrl-C must not cut the cleanup short and leave stubs or the directory behind
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop(stubs)
        shutil.rmtree(state, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace, state: str, stubs: list[subprocess.Popen]) -> int:
    from .. import config as cfgmod
    from . import serve

    try:
        open(REASONING_LOG, "w").close()  # emptied: `grep -c cancelled` counts this run only
    except OSError as err:
        print(f"demo: cannot write {REASONING_LOG}: {err.strerror}", file=sys.stderr)
        return 2
    vllm_port, ollama_port = _free_port(), _free_port()
    stubs.append(_stub("vllm", vllm_port, REASONING_LOG, args.token_delay_ms, "--reasoning", "--agent",
                       "--model", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "--max-model-len", "32768"))
    stubs.append(_stub("ollama", ollama_port, OLLAMA_LOG, args.token_delay_ms, "--agent",
                       "--model", "qwen2.5:3b-instruct"))
    for port in (vllm_port, ollama_port):
        if not _wait_port(port):
            print(f"demo: a stub backend did not start on port {port}", file=sys.stderr)
            return 1
    path = os.path.join(state, "config.yaml")
    with open(path, "w") as f:  # paths as JSON strings: valid YAML whatever $TMPDIR holds
        f.write(CONFIG.format(host=args.host, port=args.port, vllm_port=vllm_port, ollama_port=ollama_port,
                              usage=json.dumps(os.path.join(state, "usage.sqlite3")),
                              responses=json.dumps(os.path.join(state, "responses.sqlite3"))))
    print(f"demo: config, usage ledger and stored responses in {state} (removed at exit); "
          f"stub logs {REASONING_LOG}, {OLLAMA_LOG}", flush=True)
    cfg = cfgmod.load(path)
    return serve.run(cfg, path, args.host, args.port)


def _stop(stubs: list[subprocess.Popen]) -> None:
    for p in stubs:
        p.send_signal(signal.SIGTERM)
    for p in stubs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
