"""Run whisper.cpp's real `whisper-server` with Whisper tiny.en for tests/real/, speak test audio
with espeak-ng, and read the server's own evidence.

The binary, the model and espeak-ng come from `bash .ci/deps/whisper-cpp.sh`, cached under
$HLF_WHISPER_HOME (default ~/.cache/homelab-frontend/whisper.cpp). Missing in CI (CI=true): the
tests fail with that instruction; elsewhere they are skipped with it.

whisper-server decodes one request at a time (a mutex round its one model) and checks between
decoder steps whether the client's socket is still open: a client gone mid-inference aborts it,
and the server's log says "client disconnected, aborted processing" (its evidence of a
cancellation); each request it begins to decode logs "processing 'FILENAME' (N samples, S sec)"
first. Both are stderr's, unbuffered (its stdout lines, "Received request: ...", sit in stdio's
buffer of a file until it fills: no evidence to wait on). It keeps no state
the tests need, so it is stopped with SIGKILL, and `stop()` proves the process is gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from needs import require
from stubproc import free_port

WHISPER_VERSION = "1.8.5"
HOME = Path(os.environ.get("HLF_WHISPER_HOME", Path.home() / ".cache" / "homelab-frontend" / "whisper.cpp"))
BIN = HOME / WHISPER_VERSION / "bin" / "whisper-server"
GGML = HOME / "models" / "ggml-tiny.en.bin"
MODEL = "whisper"  # the client's name for it, through the gateway
UPSTREAM = "whisper-1"  # what the gateway sends as `model` (whisper.cpp reads none)
HOW = "whisper.cpp's whisper-server, Whisper tiny.en and espeak-ng are not installed: " \
      "`bash .ci/deps/whisper-cpp.sh` gets them"
ABORTED = "client disconnected, aborted processing"


def missing() -> str | None:
    if not (BIN.is_file() and os.access(BIN, os.X_OK)):
        return f"{HOW} (no {BIN})"
    if not (GGML.is_file() and GGML.stat().st_size > 0):
        return f"{HOW} (no {GGML})"
    if shutil.which("espeak-ng") is None:
        return f"{HOW} (no espeak-ng)"
    return None


def require_whisper() -> None:
    require(missing())


def speak(text: str, path: Path, *, words_per_minute: int = 160) -> Path:
    """espeak-ng's voice saying `text`, as a WAV file (22050 Hz mono 16-bit; whisper-server
    resamples it to 16 kHz itself)."""
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(words_per_minute), "-w", str(path), text],
                   check=True, capture_output=True, timeout=60)
    return path


def whisper_config(url: str, **backend) -> dict:
    """A gateway config with one backend, the whisper-server at `url` (its root: it has no /v1),
    one slot (it decodes one request at a time)."""
    from gwproc import config_for

    return config_for(
        {"whisper": {"url": url, "kind": "whispercpp", "slots": 1, "health_interval_s": 1, **backend}},
        {MODEL: {"backend": "whisper", "upstream_model": UPSTREAM}},
    )


class WhisperServer:
    """One whisper-server process on a free loopback port."""

    def __init__(self, *, threads: int = 2, extra: tuple[str, ...] = (), ready_timeout: float = 60) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hlf-whisper-"))
        self.log_path = self.dir / "whisper-server.log"
        started = time.monotonic()
        for _ in range(5):  # a free port can be taken between the probe and whisper-server's bind
            self.port = free_port()
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [str(BIN), "-m", str(GGML), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                 *extra],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            self.url = f"http://127.0.0.1:{self.port}"
            if self._wait_ready(ready_timeout):
                self.start_seconds = time.monotonic() - started
                return
            self.stop()
        raise RuntimeError(f"whisper-server did not start:\n{self.log_text()[-3000:]}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()).get("status") == "ok":
                        return True
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.1)
        return False

    # -- its own evidence --------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def received(self) -> int:
        """Requests whisper-server has taken in whole and begun to decode (its stderr's
        "processing 'FILE' (N samples, ...)" lines)."""
        return len(re.findall(r": processing '.*' \(\d+ samples", self.log_text()))

    def aborted(self) -> int:
        """Inferences it aborted because the client had gone."""
        return self.log_text().count(ABORTED)

    # -- lifecycle ---------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._log.close()
        assert not Path(f"/proc/{self.proc.pid}").exists() or _zombie(self.proc.pid), \
            f"whisper-server {self.proc.pid} is still running"

    def __enter__(self) -> "WhisperServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@pytest.fixture(scope="session")
def whisper_server():
    """One whisper-server for the session (start it in its own xdist group)."""
    require_whisper()
    with WhisperServer() as server:
        yield server
