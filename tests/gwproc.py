"""Start a real gateway process for tests: a config file, a free port, its stderr captured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import yaml

from bench.childproc import START_GUARD_S, progress, wait_listening



class Gateway:
    def __init__(self, config: dict, env: dict | None = None, extra_args: tuple = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="hlf-gw-")
        self.config_path = os.path.join(self.dir, "config.yaml")
        self.write_config(config)
        self.stderr_path = os.path.join(self.dir, "stderr.log")
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "homelab_frontend", "serve", "--config", self.config_path,
             "--port", "0", *extra_args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **(env or {})},
        )
        self.url = self._wait_listening()
        self.base = self.url + "/llm/v1"  # OpenAI SDK base_url
        self.llm = self.url + "/llm"  # Anthropic SDK base_url

    def write_config(self, config: dict) -> None:
        # stored Responses go to this gateway's own directory, never to a shared default path
        config = {**config, "responses": {**config.get("responses", {})}}
        config["responses"]["store"] = {"path": os.path.join(self.dir, "responses.sqlite3"),
                                        **config["responses"].get("store", {})}
        # and so does the usage ledger
        config["usage"] = {"path": os.path.join(self.dir, "usage.sqlite3"), **config.get("usage", {})}
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)

    def _wait_listening(self, timeout: float = START_GUARD_S) -> str:
        url = wait_listening(self.proc, timeout)
        if url is None:
            state = progress(self.proc)
            self.stop()
            raise RuntimeError(f"gateway did not start within {timeout:.0f} s ({state}):\n{self.stderr()}")
        return url

    def stderr(self) -> str:
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def access_log(self) -> list[dict]:
        out = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict | str]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        return _call(req)

    def post(self, path: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, dict | str]:
        data = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method="POST",
            headers={"content-type": "application/json", **(headers or {})},
        )
        return _call(req)

    def admin(self, headers: dict | None = None) -> dict:
        status, doc = self.get("/admin/requests", headers)
        assert status == 200, doc
        return doc  # type: ignore[return-value]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _call(req: urllib.request.Request) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw = err.read()
        status = err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def config_for(backends: dict[str, str], models: dict[str, dict], **extra) -> dict:
    """backends: name -> base URL (…/v1) or a full backend mapping."""
    cfg = {
        "backends": {
            n: ({"url": b} if isinstance(b, str) else b) for n, b in backends.items()
        },
        "models": models,
    }
    cfg.update(extra)
    return cfg
