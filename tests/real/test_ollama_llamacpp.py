"""Ollama's own API in front of llama.cpp's real `llama-server` with a real model (Gemma 3 270M),
driven by the official `ollama` Python library: /api/show's capabilities read from llama.cpp's
/props, chat plain and streamed, generate, the length limit, and a streamed chat the client closes,
judged by llama.cpp's own /slots (no slot still processing).

llama-server and the model come from `.ci/deps/llama-cpp.sh` (cached under
~/.cache/homelab-frontend/llama.cpp, or $HLF_LLAMA_HOME). Without them these tests fail in CI,
naming the script, and are skipped elsewhere."""

from __future__ import annotations

import ollama
import pytest

from gwproc import Gateway, config_for
from llamaproc import ALIAS, get, module_llama, processing_slots
from stubproc import wait_for

pytestmark = pytest.mark.timeout(300)


llama = module_llama(parallel=2, ctx=4096)


@pytest.fixture(scope="module")
def client(llama):
    cfg = config_for({"llama": {"url": llama + "/v1", "kind": "llamacpp", "slots": 2}},
                     {"gemma": {"backend": "llama", "upstream_model": ALIAS}})
    with Gateway(cfg) as gw:
        yield ollama.Client(host=gw.url)


def test_show_reads_the_servers_own_props(client, llama):
    props = get(llama + "/props")
    shown = client.show("gemma")
    caps = props["chat_template_caps"]  # this server's own account, read here independently
    assert "completion" in shown.capabilities
    assert ("tools" in shown.capabilities) == (caps["supports_tool_calls"] is True)
    assert ("thinking" in shown.capabilities) == (caps["supports_reasoning_effort"] or caps["supports_preserve_reasoning"])
    assert ("vision" in shown.capabilities) == (props["modalities"]["vision"] is True)
    assert shown.capabilities == ["completion"]  # Gemma 3 270M with its template: no tools, no thinking, text only
    # the context a request may use: llama.cpp's per-slot n_ctx (4096 over 2 slots)
    assert shown.modelinfo["unknown.context_length"] == 2048


def test_chat_plain_streamed_and_generate(client):
    messages = [{"role": "user", "content": "Name three colours."}]
    plain = client.chat(model="gemma:latest", messages=messages, stream=False, options={"temperature": 0, "num_predict": 24})
    assert plain.done and plain.message.content.strip() and plain.model == "gemma:latest"
    assert plain.prompt_eval_count > 0 and 0 < plain.eval_count <= 24
    parts = list(client.chat(model="gemma", messages=messages, stream=True, options={"temperature": 0, "num_predict": 24}))
    assert parts[-1].done and all(p.message.role == "assistant" for p in parts)
    assert "".join(p.message.content or "" for p in parts).strip()
    assert parts[-1].eval_count > 0 and parts[-1].total_duration > 0
    gen = client.generate(model="gemma", prompt="The sky is", options={"num_predict": 8})
    assert gen.done and gen.response.strip()


def test_num_predict_ends_with_done_reason_length(client):
    r = client.chat(model="gemma", messages=[{"role": "user", "content": "Write a long story about the sea."}],
                    stream=False, options={"num_predict": 5})
    assert r.done_reason == "length" and r.eval_count == 5


def test_closing_a_streamed_chat_stops_llama_cpp(client, llama):
    stream = client.chat(model="gemma", messages=[{"role": "user", "content": "Write a long story about the sea."}],
                         stream=True, options={"num_predict": 2000})
    next(stream)
    wait_for(lambda: processing_slots(llama), timeout=30)
    stream.close()
    wait_for(lambda: not processing_slots(llama), timeout=30, interval=0.1)
