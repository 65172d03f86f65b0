"""`homelab-frontend demo`: the gateway on 127.0.0.1:8080 in front of two stand-in backends.

- `reasoning` on a vLLM-flavoured stub (deepseek_r1-style reasoning, log /tmp/stub-reasoning.log,
  emptied at start so `grep -c cancelled` counts this run only);
- `qwen2.5:3b-instruct` on an Ollama-flavoured stub;
- Claude Code's and Gemini CLI's model names aliased onto them.
Tokens come every 20 ms; a prompt of `long` keeps generating for several seconds. Ctrl-C stops all.

Only glue (processes started and stopped): tests/integration/test_seed_verify.py runs it as a
user would (tests/support/unit_coverage.py's GLUE).
"""

from __future__ import annotations

import argparse
import os
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
    from .. import config as cfgmod
    from . import serve

    vllm_port, ollama_port = _free_port(), _free_port()
    open(REASONING_LOG, "w").close()
    stubs = [
        _stub("vllm", vllm_port, REASONING_LOG, args.token_delay_ms, "--reasoning", "--agent",
              "--model", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "--max-model-len", "32768"),
        _stub("ollama", ollama_port, OLLAMA_LOG, args.token_delay_ms, "--agent", "--model", "qwen2.5:3b-instruct"),
    ]
    try:
        for port in (vllm_port, ollama_port):
            if not _wait_port(port):
                print(f"demo: a stub backend did not start on port {port}", file=sys.stderr)
                return 1
        path = os.path.join(tempfile.mkdtemp(prefix="homelab-frontend-demo-"), "config.yaml")
        with open(path, "w") as f:
            f.write(CONFIG.format(host=args.host, port=args.port, vllm_port=vllm_port, ollama_port=ollama_port))
        print(f"demo: config {path}; stub logs {REASONING_LOG}, {OLLAMA_LOG}", flush=True)
        cfg = cfgmod.load(path)
        return serve.run(cfg, path, args.host, args.port)
    finally:
        for p in stubs:
            p.send_signal(signal.SIGTERM)
        for p in stubs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
