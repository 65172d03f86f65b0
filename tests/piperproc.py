"""Run a real text-to-speech server for tests/real/: local-tts-studio's OpenAI-compatible
/v1/audio/speech in front of Piper, speaking with the en_US-joe-medium voice.

All from `bash .ci/deps/piper.sh`, cached under $HLF_PIPER_HOME (default
~/.cache/homelab-frontend/piper). Missing in CI (CI=true): the tests fail with that instruction;
elsewhere they are skipped with it.

The server keeps its settings in $LOCAL_TTS_DATA_DIR/settings.json: each test server gets a
directory of its own with the voices directory and the API's default voice set (the server
speaks with that voice whatever a request's `voice` says). It answers /v1/models; its process
is stopped with SIGTERM (uvicorn), SIGKILL after a grace, and `stop()` proves it gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from needs import require
from stubproc import free_port

HOME = Path(os.environ.get("HLF_PIPER_HOME", Path.home() / ".cache" / "homelab-frontend" / "piper"))
PYTHON = HOME / "venv" / "bin" / "python"
VOICES = HOME / "voices"
VOICE = "en_US-joe-medium"
SERVED = "tts-1"  # local-tts-studio's model id
MODEL = "piper"  # the client's name for it, through the gateway
HOW = "local-tts-studio, piper-tts and the en_US-joe-medium voice are not installed: `bash .ci/deps/piper.sh` gets them"


def missing() -> str | None:
    if not (PYTHON.is_file() and (HOME / "venv" / ".hlf-installed").is_file()):
        return f"{HOW} (no {PYTHON})"
    if not (VOICES / f"{VOICE}.onnx").is_file():
        return f"{HOW} (no {VOICES / VOICE}.onnx)"
    return None


def require_piper() -> None:
    require(missing())


class PiperServer:
    """One local-tts-studio process on a free loopback port."""

    def __init__(self, *, ready_timeout: float = 120) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hlf-piper-"))
        (self.dir / "settings.json").write_text(json.dumps({"voices_dir": str(VOICES), "api_default_voice": VOICE}))
        self.log_path = self.dir / "local-tts.log"
        started = time.monotonic()
        for _ in range(5):
            self.port = free_port()
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [str(PYTHON), "-m", "local_tts.cli", "--host", "127.0.0.1", "--port", str(self.port)],
                env={**os.environ, "LOCAL_TTS_DATA_DIR": str(self.dir), "HF_HUB_OFFLINE": "1"},
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
            )
            self.url = f"http://127.0.0.1:{self.port}"
            self.base = self.url + "/v1"
            if self._wait_ready(ready_timeout):
                self.start_seconds = time.monotonic() - started
                return
            self.stop()
        raise RuntimeError(f"local-tts-studio did not start:\n{self.log_text()[-3000:]}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.base + "/models", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self._log.close()
        assert not Path(f"/proc/{self.proc.pid}/cmdline").exists() or not Path(f"/proc/{self.proc.pid}/cmdline").read_bytes(), \
            f"local-tts-studio {self.proc.pid} is still running"

    def __enter__(self) -> "PiperServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
