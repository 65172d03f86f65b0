"""What a model is, in every dialect's models list, through a real gateway in front of real stubs:
a vLLM one (which says nothing: the config's capabilities), an Ollama one (its /api/show), a
llama.cpp one (its /props and n_ctx) and a managed one that is stopped, then loading, then loaded."""

from __future__ import annotations

import threading

import pytest

from conftest import QWEN, R1
from gwproc import Gateway, config_for
from managed import stub_backend, wait_state
from rawhttp import post_raw
from stubproc import start_stub, wait_for

GEMMA = "gemma-3-270m"


@pytest.fixture(scope="module")
def llama_stub(tmpdir_session):
    import os

    with start_stub("llamacpp", "--model", GEMMA, "--max-model-len", "2048",
                    log_path=os.path.join(tmpdir_session, "stub-cards-llamacpp.log")) as s:
        yield s


@pytest.fixture(scope="module")
def gw(vllm_stub, ollama_stub, llama_stub):
    cfg = config_for(
        {"gpu0": {"url": vllm_stub.base, "kind": "vllm", "slots": 4},
         "ollama": {"url": ollama_stub.base, "kind": "ollama", "slots": 2},
         "llama": {"url": llama_stub.base, "kind": "llamacpp", "slots": 2},
         "cold": stub_backend("vllm", "--start-delay-s", "1.5", model="cold-m", uses=None)},
        {"reasoning": {"backend": "gpu0", "upstream_model": R1, "max_model_len": 32768,
                       "capabilities": ["completion", "tools", "thinking"]},
         QWEN: {"backend": "ollama"},
         "gemma": {"backend": "llama", "upstream_model": GEMMA},
         "cold": {"backend": "cold", "upstream_model": "cold-m"}},
    )
    with Gateway(cfg) as g:
        yield g


def _openai(gw) -> dict[str, dict]:
    status, doc = gw.get("/llm/v1/models")
    assert status == 200 and doc["object"] == "list"
    return {m["id"]: m for m in doc["data"]}


def test_openai_list_says_context_capabilities_and_state(gw):
    import openai

    listed = {m.id: m for m in openai.OpenAI(base_url=gw.base, api_key="x").models.list()}
    assert set(listed) == {"reasoning", QWEN, "gemma", "cold"}  # the SDK parses the list as it is
    models = _openai(gw)
    r1 = models["reasoning"]
    assert r1["context_length"] == r1["max_model_len"] == r1["meta"]["n_ctx"] == 32768  # the config's
    assert r1["capabilities"] == ["completion", "tools", "thinking"] and r1["supports_reasoning"] is True
    assert r1["state"] == "loaded" and r1["status"] == {"value": "loaded"}
    assert r1["homelab"]["backends"][0]["name"] == "gpu0" and r1["homelab"]["slots"] == 4
    gemma = models["gemma"]
    assert gemma["context_length"] == 2048  # llama.cpp's own n_ctx, read off its /v1/models
    assert "completion" in gemma["capabilities"]
    qwen = models[QWEN]
    assert qwen["capabilities"] == ["completion", "tools"]  # the Ollama stub's /api/show


def test_a_managed_model_is_stopped_then_loading_then_loaded(gw):
    wait_state(gw, "cold", "stopped")
    assert _openai(gw)["cold"]["state"] == "stopped"
    assert _openai(gw)["cold"]["status"] == {"value": "unloaded"}
    result = {}
    t = threading.Thread(target=lambda: result.update(r=post_raw(
        gw.base + "/chat/completions", {"model": "cold", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)))
    t.start()
    wait_for(lambda: _openai(gw)["cold"]["state"] == "loading", 10, 0.05)
    status, doc = gw.post("/api/show", {"model": "cold"})
    assert status == 200 and doc["state"] in ("loading", "loaded")
    t.join(30)
    assert result["r"][0] == 200
    assert _openai(gw)["cold"]["state"] == "loaded" and _openai(gw)["cold"]["loaded"] is True


def test_ollama_show_says_thinking_for_a_reasoning_model(gw):
    status, doc = gw.post("/api/show", {"model": "reasoning"})
    assert status == 200 and doc["capabilities"] == ["completion", "tools", "thinking"]
    assert doc["model_info"]["unknown.context_length"] == 32768 and doc["state"] == "loaded"
    status, tags = gw.get("/api/tags")
    entries = {m["name"]: m for m in tags["models"]}
    assert entries["reasoning:latest"]["capabilities"] == ["completion", "tools", "thinking"]
    assert entries["reasoning:latest"]["context_length"] == 32768
    assert entries["gemma:latest"]["context_length"] == 2048


def test_gemini_list_says_limits_and_thinking(gw):
    from google import genai

    client = genai.Client(api_key="x", http_options={"base_url": gw.llm})
    models = {m.name: m for m in client.models.list()}
    r1 = models["models/reasoning"]
    assert r1.input_token_limit == 32768 and r1.thinking is True
    assert models["models/gemma"].input_token_limit == 2048
    assert models[f"models/{QWEN}"].thinking is False  # the Ollama stub's model does not think
    one = client.models.get(model="reasoning")
    assert one.thinking is True and one.input_token_limit == 32768
