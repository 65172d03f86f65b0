"""The seeds' Verify commands (tasks 2.11 and 2.12), run literally with curl against `demo`.

The demo is started exactly as a user would (`homelab-frontend demo`), on a free port instead of
8080 so the suite can run beside a real gateway, and with its stub logs in a directory of this
run's own (HLF_DEMO_LOG_DIR) instead of /tmp, so that another run on the machine cannot truncate
or add to the log it counts; the commands are the seeds' own, with only the port and that
directory substituted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from bench.childproc import START_GUARD_S, wait_listening
from stubproc import free_port, wait_for

# No skip when curl is missing: the Verify commands are curl commands (.ci/deps/curl.sh installs it).

LOG_DIR = ""  # the demo's own log directory, made by the fixture


@pytest.fixture(scope="module")
def demo():
    global LOG_DIR
    LOG_DIR = tempfile.mkdtemp(prefix="hlf-demo-logs-")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "homelab_frontend", "demo", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "HLF_DEMO_LOG_DIR": LOG_DIR},
    )
    try:
        assert wait_listening(proc, START_GUARD_S), "the demo did not start"
        yield port
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        shutil.rmtree(LOG_DIR, ignore_errors=True)


def sh(cmd: str, port: int) -> str:
    cmd = cmd.replace("localhost:8080", f"localhost:{port}").replace("/tmp/stub-", f"{LOG_DIR}/stub-")
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60).stdout


# -- task 2.11 ----------------------------------------------------------------------------------


def test_211_verify_1_reasoning_shape(demo):
    out = sh("""curl -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"reasoning","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'""", demo)
    doc = json.loads(out)
    assert doc["type"] == "message" and doc["role"] == "assistant"
    assert doc["content"][0]["type"] == "thinking" and doc["content"][1]["type"] == "text"


def test_211_verify_2_no_openai_fields(demo):
    out = sh("""curl -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"reasoning","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}' \
  | grep -c -E '"choices"|"finish_reason"|"object"'""", demo)
    assert out.strip() == "0"


def test_211_verify_3_max_tokens(demo):
    out = sh("""curl -s -w '\\n%{http_code}' localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"qwen2.5:3b-instruct","max_tokens":4,"messages":[{"role":"user","content":"count to fifty"}]}'""", demo)
    body, status = out.rsplit("\n", 1)
    doc = json.loads(body)
    assert status == "200" and doc["stop_reason"] == "max_tokens"
    assert sorted(doc["usage"]) == ["input_tokens", "output_tokens"]


# -- task 2.12 ----------------------------------------------------------------------------------


def test_212_verify_1_event_order(demo):
    out = sh("""curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"reasoning","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}' \
  | grep '^event:'""", demo)
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip() != "event: ping"]
    text = " ".join(names)
    assert re.fullmatch(
        r"message_start content_block_start( content_block_delta)+ content_block_stop"
        r" content_block_start( content_block_delta)+ content_block_stop message_delta message_stop",
        text,
    ), text


def test_212_verify_2_index0_stop_before_index1(demo):
    out = sh("""curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"reasoning","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}' \
  | grep -n -E 'content_block_stop|"index":1' | head -3""", demo)
    lines = out.splitlines()
    first_stop = next(i for i, ln in enumerate(lines) if "content_block_stop" in ln and '"index":1' not in ln)
    first_index1 = next(i for i, ln in enumerate(lines) if '"index":1' in ln)
    assert first_stop < first_index1
    assert '"index":0' in next(ln for ln in lines if ln.split(":", 1)[1].startswith("data:") and "content_block_stop" in ln)


def test_212_verify_3_disconnect_cancels(demo):
    sh("""timeout 1 curl -N -s localhost:8080/llm/v1/messages -H 'content-type: application/json' \
  -d '{"model":"reasoning","max_tokens":512,"stream":true,"messages":[{"role":"user","content":"long"}]}' >/dev/null""", demo)
    gone = time.monotonic()
    wait_for(lambda: sh("grep -c 'cancelled' /tmp/stub-reasoning.log", demo).strip() == "1", 1.0)
    assert time.monotonic() - gone <= 1.0
