"""Waiting for a child process of ours to listen: `serve`, `stub` and `demo` all print
`listening on http://HOST:PORT` once their port is open; tests and the benchmark read it."""

from __future__ import annotations

import os
import re
import subprocess
import time

LISTENING = re.compile(r"listening on (http://[\w.:\[\]-]+)")

# How long a start may take before it counts as hung: a guard, not an expectation. A gateway is
# listening after about 0.7 s of CPU under coverage, but on a starved 2-core machine (a CPU hog,
# three vLLM servers, four test workers) one took longer than the 15 s the tests once allowed,
# and the test failed for a start that was only slow. A start that fails exits, and the wait ends
# at once; only a process that neither listens nor exits waits this long.
START_GUARD_S = 120.0
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads, the exited ones included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


def progress(proc: subprocess.Popen) -> str:
    """What became of a child that did not announce its port: its exit status, or that it still
    runs and how much CPU it has used (a process starved of CPU has used little; a hung one may
    have used a lot, or be blocked)."""
    code = proc.poll()
    if code is not None:
        return f"exited with {code}"
    try:
        return f"still running, {cpu_seconds(proc.pid):.2f} s of CPU used"
    except (OSError, IndexError, ValueError):
        return "still running"


def wait_listening(proc: subprocess.Popen, timeout: float) -> str | None:
    """The URL the process announces on its stdout (a pipe), or None if it exits or the time
    runs out first."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            m = LISTENING.search(buf.decode(errors="replace"))
            if m:
                return m.group(1)
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None
