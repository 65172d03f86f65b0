"""Run stub upstreams as real processes for tests (stdlib only).

    from stubproc import start_stub, wait_for

    with start_stub("vllm", "--reasoning", "--token-delay-ms", "5") as stub:
        client = openai.OpenAI(base_url=stub.base, api_key="x")
        ...
        wait_for(lambda: stub.stats()["in_flight"] == 0, timeout=1)
        assert stub.log_text().count("cancelled") == 1

A real process (not an in-process server) so that the gateway under test and the stub never
share an event loop: a blocked loop on one side cannot hide a bug on the other.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, TypeVar

from bench.childproc import START_GUARD_S, progress

T = TypeVar("T")

SRC_DIR = Path(__file__).resolve().parents[1] / "src"
STOP_GRACE = 5.0


def _port_range() -> range:
    """This process's own ports: a slice per xdist worker of the ports below the kernel's
    ephemeral range. A port the OS hands out for port 0 (a test's in-process server, any outgoing
    connection) is ephemeral, so it can never be one a test picked and has not bound yet; and no
    two workers pick from the same slice. (Port 0's free port, closed before the server binds it,
    was seen taken by another worker's port-0 server in that gap: a managed backend's probe then
    reached a stranger.)"""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = low if low > 12000 else 32768  # an ephemeral range that starts low: best effort
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    index = int(worker) if worker.isdigit() else 0
    width = (top - 10000) // count
    return range(10000 + index * width, 10000 + (index + 1) * width)


_PORTS = _port_range()
_next_port = _PORTS.start + (os.getpid() * 7919) % len(_PORTS)  # a fresh start on every run
_port_lock = threading.Lock()


def free_port() -> int:
    """A port of this worker's own that nothing listens on or is bound to now."""
    global _next_port
    with _port_lock:
        for _ in range(len(_PORTS)):
            port = _next_port
            _next_port = port + 1 if port + 1 < _PORTS.stop else _PORTS.start
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError(f"no free port in {_PORTS}")


def wait_for(predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.02) -> T:
    """Poll until `predicate()` is truthy and return its value; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(interval)


class StubHandle:
    """A running stub process. Use as a context manager, or call `stop()`."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path, temp_dir: Path | None) -> None:
        self.proc = proc
        self.url = url
        self.base = url + "/v1"
        self.log_path = log_path
        self._temp_dir = temp_dir
        self._final_log: str | None = None

    # -- HTTP helpers --
    def _call(self, method: str, path: str, data: bytes = b"") -> Any:
        request = urllib.request.Request(self.url + path, method=method, data=data if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stats(self) -> dict:
        return self._call("GET", "/stub/stats")

    def reset(self) -> dict:
        return self._call("POST", "/stub/reset")

    def fail(self, **how: Any) -> dict:
        """Every chat request fails from now on: fail(status=503, message="...") answers that
        status, fail(reset=True) closes the connection unanswered, fail(abort_after=N) drops it
        after N tokens of the answer; fail() clears it."""
        return self._call("POST", "/stub/fail", json.dumps(how).encode() if how else b"")

    def requests(self) -> list[dict]:
        """Recent chat requests, oldest first: [{"body": {...}, "headers": {lowercased: value}}]."""
        return self._call("GET", "/stub/requests")

    def log_text(self) -> str:
        if self._final_log is not None:
            return self._final_log
        try:
            return self.log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def log_lines(self) -> list[str]:
        return self.log_text().splitlines()

    # -- lifecycle --
    def stop(self) -> int | None:
        """Terminate (SIGTERM), kill after a grace period, always reap. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._temp_dir is not None and self._final_log is None:
            self._final_log = self.log_text()
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        return self.proc.returncode

    def __enter__(self) -> "StubHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


Proc = StubHandle


def _drain(stream: Any, lines: "queue.Queue[str | None]") -> None:
    # Keeps reading after start-up so the child never blocks on a full stdout pipe.
    for line in stream:
        lines.put(line)
    lines.put(None)


def start_stub(
    flavour: str = "vllm",
    *extra_args: str,
    log_path: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
) -> StubHandle:
    """Start `python -m homelab_frontend.stub --flavour F --port 0 --log L *extra_args`."""
    temp_dir = None
    if log_path is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="stub-"))
        log_path = temp_dir / "stub.log"
    log_path = Path(log_path)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), child_env.get("PYTHONPATH")) if p)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    args = [sys.executable, "-m", "homelab_frontend.stub", "--flavour", flavour, "--port", "0"]
    args += ["--log", str(log_path), *extra_args]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=child_env)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + START_GUARD_S
    seen: list[str] = []
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"stub did not start within {START_GUARD_S:.0f} s ({progress(proc)}); "
                                   f"output: {seen!r}")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"stub exited with {proc.wait()} before listening; output: {seen!r}")
            seen.append(line)
            if line.startswith("listening on "):
                url = line[len("listening on ") :].strip()
                return StubHandle(proc, url, log_path, temp_dir)
    except BaseException:
        StubHandle(proc, "", log_path, temp_dir).stop()
        raise
