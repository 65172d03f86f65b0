"""The official Ollama JavaScript library (npm `ollama`, pinned in .ci/deps/ollama-js.sh) through a
real gateway: chat streaming, a tool-calling round trip, errors, a failure mid-stream and an
abort, each driven by node (tests/support/ollama_js_client.mjs) from here. The library throws on a
stream that ends without `done: true` and reads an error's text only under application/json, so
these check both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import QWEN, R1
from gwproc import Gateway, config_for
from stubproc import wait_for

pytestmark = pytest.mark.real  # node and the npm library

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / ".ci" / "deps" / "ollama-js.sh"
DRIVER = ROOT / "tests" / "support" / "ollama_js_client.mjs"
KEY = "sk-ollama-js"


@pytest.fixture(scope="module")
def module_dir() -> str:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (.ci/deps/ollama-js.sh installs it)")
    subprocess.run([str(INSTALLER)], check=True, capture_output=True, timeout=300)
    path = subprocess.run([str(INSTALLER), "--dir"], check=True, capture_output=True, text=True).stdout.strip()
    return os.path.join(path, "node_modules", "ollama")


@pytest.fixture(scope="module")
def gw(vllm_stub, ollama_stub):
    cfg = config_for(
        {"gpu0": {"url": vllm_stub.base, "kind": "vllm", "slots": 4},
         "ollama": {"url": ollama_stub.base, "kind": "ollama", "slots": 2}},
        {"reasoning": {"backend": "gpu0", "upstream_model": R1}, QWEN: {"backend": "ollama"}},
        auth={"keys": [{"name": "js", "key": KEY}]},
    )
    with Gateway(cfg) as g:
        yield g


def run(module_dir: str, gw, scenario: str, model: str = "reasoning") -> dict:
    done = subprocess.run(["node", str(DRIVER), module_dir, gw.url, KEY, scenario, model],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_chat_stream(module_dir, gw, stubs):
    out = run(module_dir, gw, "stream")
    assert "error" not in out, out
    assert out["content"] and out["thinking"] and out["roles"] == ["assistant"]
    last = out["last"]
    assert last["done"] is True and last["done_reason"] == "stop" and last["eval_count"] == 8
    assert all(isinstance(last[k], int) for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))


def test_tool_calling_round_trip(module_dir, gw, stubs):
    vllm, ollama_stub = stubs
    out = run(module_dir, gw, "tools", QWEN)
    assert "error" not in out, out
    assert [c["function"]["name"] for c in out["calls"]] == ["get_weather"]
    assert isinstance(out["calls"][0]["function"]["arguments"], dict)  # objects, as Ollama sends them
    assert out["answer"] == "The tool said: 12 C and sunny" and out["done"] is True
    up = ollama_stub.requests()[-1]["body"]["messages"]
    # the JS library sends the id back with the call: honoured, and the tool message tied to it
    assert up[1]["tool_calls"][0]["id"] == out["calls"][0]["id"]
    assert up[2]["tool_call_id"] == out["calls"][0]["id"]


def test_error_text_and_status(module_dir, gw, stubs):
    out = run(module_dir, gw, "error")
    assert out["error"]["name"] == "ResponseError" and out["error"]["status"] == 404
    assert out["error"]["message"].startswith('model "llama3" not found')


def test_midstream_failure_is_an_error_not_a_short_answer(module_dir, gw, stubs):
    out = run(module_dir, gw, "midstream")
    assert "error" in out and "Did not receive done" not in out["error"]["message"]
    assert "mid-stream" in out["error"]["message"] or "without finishing" in out["error"]["message"]


def test_abort_cancels_the_upstream(module_dir, gw, stubs):
    vllm, _ = stubs
    before = vllm.log_text().count("cancelled")
    out = run(module_dir, gw, "abort")
    assert out.get("first")
    wait_for(lambda: vllm.log_text().count("cancelled") == before + 1, 15)
    wait_for(lambda: vllm.stats()["in_flight"] == 0, 15)
