"""Helpers for managed backends (`run:`) in tests: stub commands, the admin view, process checks."""

from __future__ import annotations

import os
import sys
import time

from stubproc import free_port, wait_for


def stub_backend(flavour: str = "vllm", *args: str, port: int | None = None, slots: int = 2,
                 uses: float | None = 1.0, model: str = "m", **run) -> dict:
    """A backend mapping whose server is a stub the gateway itself starts."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "homelab_frontend.stub", "--flavour", flavour, "--port", str(port),
           "--model", model, *args]
    r = {"cmd": cmd, "start_timeout_s": 30, "stop_timeout_s": 5, **run}
    if uses is not None:
        r["uses"] = {"gpu": uses}
    kind = {"vllm": "vllm", "llamacpp": "llamacpp", "ollama": "ollama", "whispercpp": "whispercpp",
            "kokoro": "openai", "speaches": "openai", "sdcpp": "openai"}[flavour]
    # whisper.cpp's server has no /v1 (its /inference and /health sit at its root)
    url = f"http://127.0.0.1:{port}" + ("" if flavour == "whispercpp" else "/v1")
    return {"url": url, "slots": slots, "kind": kind, "health_interval_s": 1, "run": r}


def backends(gw, headers: dict | None = None) -> dict[str, dict]:
    status, doc = gw.get("/admin/backends", headers)
    assert status == 200, doc
    return {b["name"]: b for b in doc["backends"]}


def wait_state(gw, name: str, *states: str, timeout: float = 30.0) -> dict:
    def check():
        b = backends(gw)[name]
        return b if b["state"] in states else None
    try:
        return wait_for(check, timeout, 0.05)
    except AssertionError:
        raise AssertionError(f"{name} not {states} within {timeout}s: {backends(gw)[name]}\n{gw.stderr()[-3000:]}")


def _state(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Some thread of the process still runs. A zombie has exited (it holds no GPU, no port), but a
    multi-threaded server's main thread shows as a zombie while its other threads, which still
    hold its sockets, are exiting: so every thread is looked at."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(_state(f"/proc/{pid}/task/{t}/stat") not in (None, "Z", "X") for t in tasks)


def wait_gone(pid: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still running")
        time.sleep(0.05)


def port_closed(port: int) -> bool:
    """Nothing listens on the port. A connect to a free loopback port in the ephemeral range can
    succeed by connecting to itself (the kernel picks that very port as the source: TCP
    simultaneous open): that is not a listener."""
    import socket
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return True
        return s.getsockname() == s.getpeername()


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (by /proc, so only the group we started is looked at)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and alive(int(entry)):
            out.append(int(entry))
    return out
