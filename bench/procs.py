"""The processes a benchmark run starts (stub upstream, gateway, optional LiteLLM proxy, load
generator) and what /proc says about them: CPU seconds and resident memory."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.childproc import cpu_seconds, wait_listening

ROOT = Path(__file__).resolve().parents[1]


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak since start), in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) / 1024
    return {"rss_mb": out.get("VmRSS", 0.0), "hwm_mb": out.get("VmHWM", 0.0)}


class Proc:
    """A child process that prints `listening on http://HOST:PORT` once it serves."""

    def __init__(self, name: str, argv: list[str], workdir: str, env: dict | None = None,
                 start_timeout: float = 20.0) -> None:
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._log, env={**os.environ, **(env or {})},
            cwd=str(ROOT), start_new_session=True,
        )
        self.pid = self.proc.pid
        self.url = self._wait_listening(start_timeout)

    def _wait_listening(self, timeout: float) -> str:
        url = wait_listening(self.proc, timeout)
        if url is None:
            self.stop()
            raise RuntimeError(f"{self.name} did not start; its log:\n{self.log_tail()}")
        return url

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def memory(self) -> dict[str, float]:
        return memory_mb(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def start_stub(workdir: str, model: str) -> Proc:
    return Proc("stub", [sys.executable, "-m", "homelab_frontend.stub", "--flavour", "vllm", "--port", "0",
                         "--model", model, "--max-model-len", "8192"], workdir)


def start_gateway(workdir: str, stub_url: str, model: str, upstream_model: str, slots: int,
                  name: str = "gateway", ledger: bool = True) -> Proc:
    cfg = {
        "backends": {"stub": {"url": stub_url + "/v1", "kind": "vllm", "slots": slots,
                              "queue": {"depth": 1024, "timeout_s": 60}}},
        "models": {model: {"backend": "stub", "upstream_model": upstream_model}},
        # the access log is part of the per-request cost: written, as in production, to a file
        "access_log": os.path.join(workdir, f"{name}-access.log"),
        # so is the usage ledger (on by default): its SQLite file in the run's directory
        "usage": {"enabled": ledger, "path": os.path.join(workdir, f"{name}-usage.sqlite3")},
    }
    path = os.path.join(workdir, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    return Proc(name, [sys.executable, "-m", "homelab_frontend", "serve", "--config", path, "--port", "0"], workdir)


def start_floor(workdir: str, stub_url: str) -> Proc:
    return Proc("floor", [sys.executable, "-m", "bench.floor", "--upstream", stub_url + "/v1"], workdir)


LITELLM_KEY = "sk-bench-" + secrets.token_hex(16)


def litellm_command() -> list[str] | None:
    """How to start LiteLLM's proxy here, or None when it is not installed."""
    exe = os.environ.get("LITELLM_BIN") or shutil.which("litellm") or shutil.which(
        "litellm", path=str(Path(sys.executable).parent)
    )
    return [exe] if exe else None


def start_litellm(workdir: str, stub_url: str, model: str, upstream_model: str) -> Proc:
    cmd = litellm_command()
    assert cmd is not None
    cfg = {
        "model_list": [{
            "model_name": model,
            "litellm_params": {"model": f"openai/{upstream_model}", "api_base": stub_url + "/v1",
                               "api_key": "unused"},
        }],
        "litellm_settings": {"drop_params": True, "telemetry": False},
        # it refuses to start without one; a throwaway key, on loopback
        "general_settings": {"master_key": LITELLM_KEY},
        # one failure must not bench the only deployment for seconds (429s instead of answers)
        "router_settings": {"disable_cooldowns": True, "num_retries": 0},
    }
    path = os.path.join(workdir, "litellm.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    port = _free_port()
    proc = _LiteLLM("litellm", [*cmd, "--config", path, "--host", "127.0.0.1", "--port", str(port),
                                "--num_workers", "1"], workdir, port,
                    env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True",
                         # loopback only: no model-cost map from the internet at start-up
                         "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                         # /v1/messages onto the upstream's chat completions, not /v1/responses
                         "LITELLM_USE_CHAT_COMPLETIONS_URL_FOR_ANTHROPIC_MESSAGES": "true"})
    return proc


class _LiteLLM(Proc):
    """LiteLLM prints no parseable URL line; it is ready when /health/liveliness answers."""

    def __init__(self, name: str, argv: list[str], workdir: str, port: int, env: dict) -> None:
        self._port = port
        super().__init__(name, argv, workdir, env=env, start_timeout=120.0)

    def _wait_listening(self, timeout: float) -> str:
        import urllib.request

        url = f"http://127.0.0.1:{self._port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/health/liveliness", timeout=2):
                    return url
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"litellm did not start; its log:\n{self.log_tail()}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoadGen:
    """The load generator process; `run(spec)` measures once and returns its JSON result.
    With `on_warm`, the callback runs after the warm-up and before the timed requests."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            cwd=str(ROOT), text=True, bufsize=1, start_new_session=True,
        )
        self.pid = self.proc.pid

    def run(self, spec: dict, on_warm=None) -> dict:
        spec = {**spec, "pause_after_warmup": on_warm is not None}
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the load generator died")
        doc = json.loads(line)
        if doc.get("warm"):
            warm_errors = doc.get("errors", 0)
            on_warm()
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the load generator died")
            doc = json.loads(line)
            doc["warmup_errors"] = warm_errors
        return doc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def workdir() -> str:
    return tempfile.mkdtemp(prefix="hlf-bench-")
