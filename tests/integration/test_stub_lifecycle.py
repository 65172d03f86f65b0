"""The stub's model-lifecycle wire: llama.cpp's 503 "Loading model" during --start-delay-s,
vLLM's port opening only after it, vLLM's sleep mode, and failing at start on demand."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

from stubproc import start_stub, wait_for


def get(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, method=method, data=body,
                                 headers={"content-type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw) if raw else ""
    except ValueError:
        return status, raw.decode()


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_llamacpp_answers_503_loading_model_until_its_start_delay_has_passed():
    with start_stub("llamacpp", "--model", "m", "--start-delay-s", "1.5") as s:
        status, doc = get(s.url + "/health")
        assert status == 503 and doc["error"]["message"] == "Loading model"
        assert get(s.base + "/models")[0] == 503
        wait_for(lambda: get(s.url + "/health")[0] == 200, 10)
        assert get(s.base + "/chat/completions", "POST", CHAT)[0] == 200


def test_vllm_binds_its_port_only_after_the_start_delay():
    t0 = time.monotonic()
    with start_stub("vllm", "--model", "m", "--start-delay-s", "1") as s:
        assert time.monotonic() - t0 >= 1
        assert get(s.base + "/models")[0] == 200


def test_vllm_sleep_mode():
    with start_stub("vllm", "--model", "m", "--sleep-delay-s", "0.1", "--wake-delay-s", "0.2") as s:
        assert get(s.url + "/is_sleeping") == (200, {"is_sleeping": False})
        assert get(s.url + "/sleep?level=1", "POST")[0] == 200
        assert get(s.url + "/is_sleeping") == (200, {"is_sleeping": True})
        status, doc = get(s.base + "/chat/completions", "POST", CHAT)
        assert status == 503 and "sleeping" in doc["error"]["message"]
        assert get(s.base + "/models")[0] == 200  # what needs no weights still answers
        assert get(s.url + "/sleep?level=x", "POST")[0] == 400
        assert get(s.url + "/wake_up", "POST")[0] == 200
        assert get(s.url + "/is_sleeping") == (200, {"is_sleeping": False})
        assert get(s.base + "/chat/completions", "POST", CHAT)[0] == 200
        assert "sleep level=1" in s.log_text() and "wake_up" in s.log_text()


def test_exit_at_start_on_demand(tmp_path):
    flag = tmp_path / "fail"
    flag.write_text("5")
    args = [sys.executable, "-m", "homelab_frontend.stub", "--port", "0", "--exit-at-start-file", str(flag)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert done.returncode == 5 and "failed to load model" in done.stderr
    done = subprocess.run([sys.executable, "-m", "homelab_frontend.stub", "--port", "0", "--exit-at-start", "2"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    flag.unlink()
    with start_stub("vllm", "--exit-at-start-file", str(flag)) as s:  # no file: it serves
        assert get(s.base + "/models")[0] == 200
