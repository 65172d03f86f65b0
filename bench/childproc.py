"""Waiting for a child process of ours to listen: `serve`, `stub` and `demo` all print
`listening on http://HOST:PORT` once their port is open; tests and the benchmark read it."""

from __future__ import annotations

import os
import re
import subprocess
import time

LISTENING = re.compile(r"listening on (http://[\w.:\[\]-]+)")


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
