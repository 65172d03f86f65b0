"""The real vLLM of the tests is what the suite says it is, and its fixture sees every process
of it: the proof that `VllmServer.stop()` leaves none behind (tests/vllmproc.py) is only as good
as `survivors()`, so it must find each one while the server runs."""

from __future__ import annotations

import json
import urllib.request

import pytest

from vllmproc import SERVED, VLLM_VERSION

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(300)]


def test_it_is_vllm_0_32_serving_the_converted_gemma(vllm):
    with urllib.request.urlopen(vllm.url + "/version", timeout=10) as r:
        assert json.loads(r.read())["version"] == VLLM_VERSION
    with urllib.request.urlopen(vllm.base + "/models", timeout=10) as r:
        card = json.loads(r.read())["data"][0]
    assert (card["id"], card["owned_by"], card["max_model_len"]) == (SERVED, "vllm", vllm.max_model_len)


def test_survivors_sees_the_api_server_the_engine_its_worker_and_the_resource_tracker(vllm):
    cmds = [cmd for _, cmd in vllm.survivors()]
    assert any("vllm.entrypoints.openai.api_server" in c for c in cmds), cmds
    assert any(c.startswith("VLLM::EngineCore") for c in cmds), cmds
    assert any(c.startswith("VLLM::Worker") for c in cmds), cmds
    assert any("resource_tracker" in c for c in cmds), cmds
    assert vllm.proc.pid in [pid for pid, _ in vllm.survivors()]
