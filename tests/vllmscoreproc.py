"""A second, small vLLM for tests/real/: the pooling runner serving all-MiniLM-L6-v2, for the
gateway's /rerank and /score against the real engine.

The venv is vllm.sh's (tests/vllmproc.py); the model comes from `bash .ci/deps/minilm.sh`, cached
under $HLF_MINILM_HOME (default ~/.cache/homelab-frontend/minilm). all-MiniLM-L6-v2 is an
embedding model: vLLM 0.32 serves `/rerank`, `/v1/rerank`, `/v2/rerank` and `/score` for an
`embed` model by the cosine of the query's and each document's embedding (entrypoints/pooling/
utils.py enable_scoring_api), so its scores are cosines in [-1, 1], the relevant document first.

Started once per test session (a fixture in its own xdist group); it is far lighter than the
Gemma server (22M parameters, no KV cache to speak of) but still vLLM's three processes.
Everything else (its evidence, its stop and the proof that its whole tree is gone) is VllmServer's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from gwproc import config_for
from needs import require
from stubproc import free_port
from vllmproc import PYTHON, VllmServer, server_env
from vllmproc import missing as vllm_missing

MINILM_HOME = Path(os.environ.get("HLF_MINILM_HOME", Path.home() / ".cache" / "homelab-frontend" / "minilm"))
MODEL_DIR = MINILM_HOME / "all-minilm-l6-v2"
SERVED = "all-minilm-l6-v2"  # the upstream model name
MODEL = "minilm"  # the client's name for it, through the gateway
SLOTS = 4
HOW = "all-MiniLM-L6-v2 is not installed: `bash .ci/deps/minilm.sh` gets it"


def missing() -> str | None:
    why = vllm_missing()
    if why is not None:
        return why
    if not (MODEL_DIR / "model.safetensors").is_file():
        return f"{HOW} (no {MODEL_DIR})"
    return None


def require_score_vllm() -> None:
    require(missing())


def score_config(base: str, **backend) -> dict:
    """A gateway config with one backend, the pooling vLLM at `base` (…/v1)."""
    return config_for(
        {"scorer": {"url": base, "kind": "vllm", "slots": SLOTS, "health_interval_s": 1, **backend}},
        {MODEL: {"backend": "scorer", "upstream_model": SERVED, "capabilities": ["rerank"]}},
    )


def score_args(port: int) -> list[str]:
    return [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL_DIR), "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(SLOTS), "--max-model-len", "256", "--enforce-eager", "--enable-log-requests"]


class ScoreVllm(VllmServer):
    """vLLM's pooling runner with all-MiniLM-L6-v2 on a free loopback port."""

    def __init__(self, *, ready_timeout: float = 600) -> None:  # noqa: D107 (VllmServer's, other args)
        self.dir = Path(tempfile.mkdtemp(prefix="hlf-vllm-score-"))
        self.log_path = self.dir / "vllm.log"
        self.max_num_seqs, self.max_model_len = SLOTS, 256
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self._log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            score_args(self.port), env=server_env(self.token), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.dir,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = self.url + "/v1"
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_after = time.monotonic() - self.started

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) while starting:\n{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.base + "/models", timeout=5) as r:
                    if SERVED in r.read().decode():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM (pooling) not ready after {timeout:g} s:\n{self.log_text()[-4000:]}")

    def scored_requests(self) -> int:
        """Requests vLLM itself finished (`vllm:request_success_total`): a rerank is one request
        per document in the engine."""
        return int(self.metrics().get("vllm:request_success_total", 0))
