"""Run llama.cpp's real `llama-server` with Gemma 3 270M for tests/real/, and read its own evidence.

The binary and the model come from `bash .ci/deps/llama-cpp.sh`, cached under $HLF_LLAMA_HOME
(default ~/.cache/homelab-frontend/llama.cpp). Missing in CI (CI=true): the tests fail with that
instruction; elsewhere they are skipped with it.

llama-server does not exit on SIGTERM while a non-streaming generation runs (its HTTP thread
waits for the result), so it is always stopped with SIGKILL: the tests own no state in it.
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

import pytest

from gwproc import config_for
from needs import require
from stubproc import free_port

LLAMA_VERSION = "11434.0.0"
HOME = Path(os.environ.get("HLF_LLAMA_HOME", Path.home() / ".cache" / "homelab-frontend" / "llama.cpp"))
BIN = HOME / LLAMA_VERSION / "bin" / "llama-server"
GGUF = HOME / "models" / "gemma-3-270m-q4_k_m.gguf"
# The same model with FIM tokens named in its metadata (.ci/deps/llama-fim.sh): llama.cpp answers
# /infill with it (the editors' tests: tests/real/test_editors_llamacpp.py)
FIM_GGUF = HOME / "models" / "gemma-3-270m-fim-q4_k_m.gguf"
FIM_TOKENS = {"prefix": "<unused2>", "suffix": "<unused3>", "middle": "<unused4>"}  # ids 8, 9, 10, as text
ALIAS = "gemma-3-270m"  # the upstream model name
MODEL = "gemma"  # the client's name for it, through the gateway
# The GGUF is the base model and embeds no chat template (llama.cpp would fall back to ChatML,
# which Gemma answers with `<|im_end|>` soup): Gemma 3's own template, see the file's header.
TEMPLATE = Path(__file__).resolve().parent / "real" / "gemma3.jinja"
HOW = "llama.cpp's llama-server and the Gemma 3 270M model are not installed: `bash .ci/deps/llama-cpp.sh` gets them"


def missing() -> str | None:
    if not (BIN.is_file() and os.access(BIN, os.X_OK)):
        return f"{HOW} (no {BIN})"
    if not (GGUF.is_file() and GGUF.stat().st_size > 0):
        return f"{HOW} (no {GGUF})"
    return None


def require_llama() -> None:
    require(missing())


def require_llama_fim() -> None:
    require(missing() or (None if FIM_GGUF.is_file() and FIM_GGUF.stat().st_size > 0 else
                          f"the FIM copy of the model is not made: `bash .ci/deps/llama-fim.sh` makes it (no {FIM_GGUF})"))


def llama_config(base: str, **backend) -> dict:
    return config_for(
        {"llama": {"url": base, "kind": "llamacpp", "slots": 2, "health_interval_s": 1, **backend}},
        {MODEL: {"backend": "llama", "upstream_model": ALIAS}},
    )


def module_llama(*, parallel: int, ctx: int):
    """A module's own `llama` fixture: one llama-server for the module, yielding its url, for
    tests that need another size than tests/real/conftest.py's shared server."""

    @pytest.fixture(scope="module", name="llama")
    def llama():
        require_llama()
        with LlamaServer(parallel=parallel, ctx=ctx) as server:
            yield server.url

    return llama


def get(url: str):
    """A llama-server endpoint's answer: JSON decoded, anything else (/metrics) as text."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def processing_slots(url: str) -> list[int]:
    """The ids of the slots the server at `url` itself says are generating (or prefilling)."""
    return [s["id"] for s in get(url + "/slots") if s.get("is_processing")]


def tokens_predicted(url: str) -> float:
    """The server's own count of tokens it has generated (/metrics), 0 before the first."""
    line = [ln for ln in get(url + "/metrics").splitlines() if ln.startswith("llamacpp:tokens_predicted_total")]
    return float(line[0].split()[-1]) if line else 0.0


class LlamaServer:
    """One llama-server process on a free loopback port."""

    # One thread: llama.cpp's worker threads spin at their barriers, and two of them on a 2-core
    # machine that also runs the gateway, the clients and other work slowed decoding from ~80 to
    # a few tokens a second (so a stopped stream was noticed only seconds later, at its next token).
    def __init__(self, *, parallel: int = 2, ctx: int = 2048, threads: int = 1, extra: tuple[str, ...] = (),
                 port: int | None = None, gguf: Path = GGUF) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hlf-llama-"))
        self.log_path = self.dir / "llama-server.log"
        self.parallel, self.ctx = parallel, ctx
        for _ in range(5):  # a free port can be taken between the probe and llama-server's bind
            self.port = port or free_port()  # a given port: a server brought back where it was
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [str(BIN), "-m", str(gguf), "--alias", ALIAS, "--host", "127.0.0.1", "--port", str(self.port),
                 "--parallel", str(parallel), "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
                 "--metrics", "--slots", "--jinja", "--chat-template-file", str(TEMPLATE), "--no-warmup",
                 *extra],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            self.url = f"http://127.0.0.1:{self.port}"
            self.base = self.url + "/v1"
            if self._wait_ready(60):
                return
            self.kill()
        raise RuntimeError(f"llama-server did not start:\n{self.log_text()[-3000:]}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    # -- its own evidence ------------------------------------------------------------------------

    def get_json(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def slots(self) -> list[dict]:
        return self.get_json("/slots")

    def processing(self) -> int:
        """Slots llama.cpp itself says are generating (or prefilling)."""
        return sum(1 for s in self.slots() if s.get("is_processing"))

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name.split("{")[0]] = float(value)
                except ValueError:
                    pass
        return out

    def idle(self) -> bool:
        """Two new connections per call: poll it every 0.25 s, not faster. At 0.05 s (40
        connections a second to llama-server's small HTTP side) on a loaded machine, the gateway's
        own connections to it once timed out, the backend was marked down, and the rest of the
        group's tests got 503s."""
        return self.processing() == 0 and self.metrics().get("llamacpp:requests_processing", 0) == 0

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- lifecycle ---------------------------------------------------------------------------------

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
