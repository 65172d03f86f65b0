"""tests/hostile_upstream.py as a process a test starts and stops: the fault-injecting upstream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from bench.childproc import START_GUARD_S, progress, wait_listening

HOSTILE = Path(__file__).resolve().parents[1] / "hostile_upstream.py"


class Hostile:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HOSTILE), "--port", "0"], stdout=subprocess.PIPE)
        url = wait_listening(self.proc, START_GUARD_S)
        assert url, f"hostile upstream did not start ({progress(self.proc)})"
        self.url = url
        self.base = url + "/v1"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
