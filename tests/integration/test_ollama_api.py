"""Ollama's own API through a real gateway, driven by the official `ollama` Python library (and raw
HTTP for wire details), in front of real stubs: a reasoning vLLM, an Ollama and a llama.cpp.

Capabilities come from three sources here: the Ollama stub's /api/show, the llama.cpp stub's
/props, and a `capabilities:` list in the config for the vLLM model (vLLM says nothing)."""

from __future__ import annotations

import base64
import json
import os
import socket

import ollama
import pytest

from conftest import QWEN, R1
from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for

KEY = "sk-ollama-test"
ADMIN = {"Authorization": "Bearer sk-admin-test"}
GEMMA = "gemma-3-270m"


@pytest.fixture(scope="module")
def llama_stub(tmpdir_session):
    with start_stub("llamacpp", "--model", GEMMA, "--max-model-len", "2048",
                    log_path=os.path.join(tmpdir_session, "stub-ollama-llamacpp.log")) as s:
        yield s


@pytest.fixture(scope="module")
def gw(vllm_stub, ollama_stub, llama_stub):
    cfg = config_for(
        {"gpu0": {"url": vllm_stub.base, "kind": "vllm", "slots": 4},
         "ollama": {"url": ollama_stub.base, "kind": "ollama", "slots": 2},
         "llama": {"url": llama_stub.base, "kind": "llamacpp", "slots": 2}},
        {"reasoning": {"backend": "gpu0", "upstream_model": R1, "capabilities": ["completion", "tools", "thinking"]},
         QWEN: {"backend": "ollama"},
         "gemma": {"backend": "llama", "upstream_model": GEMMA},
         "plain": {"backend": "gpu0", "upstream_model": R1}},
        auth={"keys": [{"name": "ollama-user", "key": KEY}, {"name": "narrow", "key": "sk-narrow", "models": ["gemma"]}],
              "admin_key_env": "HLF_TEST_ADMIN_KEY"},
    )
    with Gateway(cfg, env={"HLF_TEST_ADMIN_KEY": "sk-admin-test"}) as g:
        yield g


@pytest.fixture
def client(gw, stubs, llama_stub):
    llama_stub.reset()
    return ollama.Client(host=gw.url, headers={"Authorization": f"Bearer {KEY}"})


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def last_upstream(stub) -> dict:
    return stub.requests()[-1]["body"]


# -- models -------------------------------------------------------------------------------------


def test_version_is_numeric_and_needs_no_key(gw):
    status, doc = gw.get("/api/version")
    assert status == 200
    assert tuple(int(p) for p in doc["version"].split(".")) >= (0, 6, 4)  # VS Code Copilot's minimum
    assert gw.get("/llm/api/version", {"Authorization": f"Bearer {KEY}"})[1] == doc  # Open WebUI sends its key


def test_list_names_every_model_the_key_may_use_with_tags(client, gw):
    listed = client.list()
    assert sorted(m.model for m in listed.models) == sorted(["reasoning:latest", QWEN, "gemma:latest", "plain:latest"])
    narrow = ollama.Client(host=gw.url, headers={"Authorization": "Bearer sk-narrow"})
    assert [m.model for m in narrow.list().models] == ["gemma:latest"]
    status, doc = gw.get("/api/tags")
    assert status == 401 and doc == {"error": "missing API key: send it as x-api-key or Authorization: Bearer"}


def test_show_capabilities_from_each_source(client):
    r = client.show("reasoning")  # the config's list (vLLM says nothing)
    assert r.capabilities == ["completion", "tools", "thinking"]
    assert r.modelinfo["general.architecture"] == "unknown"
    assert r.modelinfo["unknown.context_length"] == 4096  # the vLLM stub's max_model_len
    assert r.modelinfo["general.basename"] == "reasoning"
    q = client.show(QWEN)  # the Ollama backend's own /api/show
    assert q.capabilities == ["completion", "tools"]
    assert q.modelinfo["general.architecture"] == "qwen2" and q.details.family == "qwen2"
    assert q.template == "{{ .Prompt }}"
    g = client.show("gemma:latest")  # llama.cpp's /props
    assert g.capabilities == ["completion", "tools"]
    assert g.modelinfo["unknown.context_length"] == 2048
    p = client.show("plain")  # no source at all: nothing but completion is claimed
    assert p.capabilities == ["completion"] and p.template is None


def test_unknown_model_is_ollamas_404(client):
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="llama3", messages=user("hi"))
    assert exc.value.status_code == 404
    assert exc.value.error.startswith('model "llama3" not found')
    with pytest.raises(ollama.ResponseError) as exc:
        client.show("llama3:8b")
    assert exc.value.status_code == 404


def test_ps_lists_the_models_whose_backends_hold_slots(client, vllm_stub):
    assert client.ps().models == []
    stream = client.chat(model="reasoning", messages=user("[stub content=200 delay_ms=50]"), stream=True)
    next(stream)
    running = client.ps().models
    assert [m.name for m in running] == ["reasoning:latest", "plain:latest"]  # both on the busy backend
    assert running[0].context_length == 4096
    tags = {m.model for m in client.list().models}
    assert {m.name for m in running} <= tags  # Open WebUI matches them by name
    stream.close()


# -- chat -----------------------------------------------------------------------------------------


def test_chat_plain(client, vllm_stub):
    r = client.chat(model="reasoning", messages=user("[stub reasoning=3 content=5]"), stream=False)
    assert r.model == "reasoning" and r.done and r.done_reason == "stop"
    assert r.message.role == "assistant" and r.message.content and r.message.thinking
    assert r.eval_count == 8 and r.prompt_eval_count > 0
    assert r.total_duration >= r.eval_duration >= 0 and isinstance(r.load_duration, int)
    # an always-up backend loads nothing, and the answer's time is eval time: clients show
    # eval_count / eval_duration as tokens per second
    assert r.load_duration == 0 and r.eval_duration > 0
    up = last_upstream(vllm_stub)
    assert up["model"] == R1 and up.get("stream") is not True or up.get("stream") is False


def test_chat_streamed_with_latest_tag(client, vllm_stub):
    parts = list(client.chat(model="reasoning:latest", messages=user("[stub reasoning=2 content=6]"), stream=True))
    assert all(p.message.role == "assistant" for p in parts)
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts)
    assert "".join(p.message.thinking or "" for p in parts)
    last = parts[-1]
    assert last.model == "reasoning:latest" and last.done_reason == "stop" and last.eval_count == 8
    assert last_upstream(vllm_stub)["model"] == R1


def test_chat_stream_wire_is_ndjson_without_blank_lines(gw, stubs):
    import urllib.request

    req = urllib.request.Request(
        gw.url + "/api/chat", method="POST",
        data=json.dumps({"model": "reasoning", "messages": user("[stub ttft_ms=300 content=3]")}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["content-type"] == "application/x-ndjson"
        raw = resp.read()
    assert raw.endswith(b"\n") and b"\n\n" not in raw and not raw.startswith(b"\n")
    objs = [json.loads(line) for line in raw.splitlines()]
    assert objs[-1]["done"] is True and all(o["done"] is False for o in objs[:-1])


def test_options_think_and_format_reach_the_upstream(client, vllm_stub):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    client.chat(model="reasoning", messages=user("[stub content=3]"), stream=False, think="high", format=schema,
                options={"temperature": 0.1, "top_p": 0.5, "top_k": 7, "seed": 42, "stop": ["END"], "num_predict": 16,
                         "num_ctx": 8192, "mirostat": 1})
    up = last_upstream(vllm_stub)
    assert up["reasoning_effort"] == "high" and up["temperature"] == 0.1 and up["top_p"] == 0.5 and up["top_k"] == 7
    assert up["seed"] == 42 and up["stop"] == ["END"] and up["max_tokens"] == 16
    assert up["response_format"] == {"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}
    assert "num_ctx" not in json.dumps(up) and "mirostat" not in up and "options" not in up
    client.chat(model="reasoning", messages=user("[stub content=3]"), stream=False, format="json", think=False)
    up = last_upstream(vllm_stub)
    assert up["response_format"] == {"type": "json_object"}
    assert up["chat_template_kwargs"] == {"enable_thinking": False}


def test_num_predict_is_clamped_to_the_context(client, vllm_stub):
    r = client.chat(model="reasoning", messages=user("[stub content=3]"), stream=False, options={"num_predict": 1_000_000})
    assert r.done
    assert last_upstream(vllm_stub)["max_tokens"] < 4096


def test_structured_output_round_trip(client, vllm_stub):
    r = client.chat(model="reasoning", messages=user('[stub reasoning=0 content=1 text={"city":"Paris"}]'),
                    stream=False, format={"type": "object"})
    assert r.done and r.message.content


def test_tool_calling_round_trip(client, ollama_stub):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = user("[stub agent chain=get_weather]")  # call the tool, then answer from its result
    r = client.chat(model=QWEN, messages=messages, tools=tools, stream=False)
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    sent_args = json.dumps(dict(call.function.arguments), separators=(",", ":"))
    up = last_upstream(ollama_stub)
    assert up["tools"][0]["function"]["name"] == "get_weather"
    messages.append(r.message)
    messages.append({"role": "tool", "content": "12 C and sunny", "tool_name": "get_weather"})
    parts = list(client.chat(model=QWEN, messages=messages, tools=tools, stream=True))
    assert parts[-1].done and "".join(p.message.content or "" for p in parts) == "The tool said: 12 C and sunny"
    up = last_upstream(ollama_stub)
    call_id = up["messages"][1]["tool_calls"][0]["id"]
    assert up["messages"][1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": sent_args}
    assert up["messages"][2] == {"role": "tool", "tool_call_id": call_id, "content": "12 C and sunny"}


def test_streamed_tool_call_arrives_whole_with_object_arguments(client, vllm_stub):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    parts = list(client.chat(model="reasoning", messages=user('[stub reasoning=1 tool=lookup args={"q":"x","n":[1,2]}]'),
                             tools=tools, stream=True))
    calls = [tc for p in parts for tc in (p.message.tool_calls or [])]
    assert len(calls) == 1 and dict(calls[0].function.arguments) == {"q": "x", "n": [1, 2]}
    assert parts[-1].done


def test_images_go_upstream_as_data_urls(client, vllm_stub):
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
    client.chat(model="reasoning", messages=[{"role": "user", "content": "what is it", "images": [png]}], stream=False)
    parts = last_upstream(vllm_stub)["messages"][-1]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}


def test_bad_input_is_a_400_naming_the_field(client):
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat(model="reasoning", messages=user("x"), options={"temperature": "hot"})
    assert exc.value.status_code == 400 and exc.value.error.startswith("options.temperature:")
    with pytest.raises(ollama.ResponseError) as exc:
        client.generate(model="reasoning", prompt="def f(", suffix="    return 1")
    assert exc.value.status_code == 400 and exc.value.error.startswith("suffix:")


def test_midstream_failure_ends_with_an_error_object(client, vllm_stub):
    with pytest.raises(ollama.ResponseError) as exc:
        for _ in client.chat(model="reasoning", messages=user("[stub reasoning=0 content=20 fail_after=3]"), stream=True):
            pass
    assert "mid-stream" in exc.value.error or "without finishing" in exc.value.error


# -- generate, load / unload, embeddings, management -------------------------------------------------


def test_generate_plain_and_streamed(client, vllm_stub):
    r = client.generate(model="reasoning", prompt="[stub reasoning=2 content=4]", system="be brief", stream=False)
    assert r.done and r.response and r.thinking and r.eval_count == 6
    up = last_upstream(vllm_stub)
    assert [m["role"] for m in up["messages"]] == ["system", "user"]
    parts = list(client.generate(model="reasoning:latest", prompt="[stub reasoning=0 content=4]", stream=True))
    assert parts[-1].done and "".join(p.response for p in parts)


def test_load_and_open_webuis_unload_are_one_object_without_a_slot(gw, vllm_stub, stubs):
    before = len(vllm_stub.requests())
    status, doc = gw.post("/api/generate", {"model": "reasoning:latest", "prompt": "", "keep_alive": 0},
                          {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and doc["done"] is True and doc["done_reason"] == "unload" and doc["response"] == ""
    status, doc = gw.post("/api/chat", {"model": "reasoning", "messages": []}, {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and doc["done_reason"] == "load" and doc["message"] == {"role": "assistant", "content": ""}
    assert len(vllm_stub.requests()) == before


def test_embed_and_the_older_embeddings(client, vllm_stub):
    r = client.embed(model="reasoning", input=["one", "two"])
    assert len(r.embeddings) == 2 and all(isinstance(x, float) for x in r.embeddings[0])
    assert r.prompt_eval_count > 0
    # an always-up backend loads nothing: the queue and the backend's answer are not load time
    assert r.load_duration == 0 and r.total_duration > 0
    old = client.embeddings(model="reasoning", prompt="one")
    assert list(old.embedding) == list(r.embeddings[0])


@pytest.mark.parametrize("call", ["pull", "push", "create", "copy", "delete"])
def test_model_management_is_refused_in_ollamas_shape(client, call):
    with pytest.raises(ollama.ResponseError) as exc:
        if call == "pull":
            client.pull("llama3")
        elif call == "push":
            client.push("me/llama3")
        elif call == "create":
            client.create(model="mine", from_="reasoning")
        elif call == "copy":
            client.copy("reasoning", "mine")
        else:
            client.delete("reasoning")
    assert "does not manage models" in exc.value.error


def test_unknown_api_path_is_an_ollama_404(gw):
    status, doc = gw.get("/api/nope", {"Authorization": f"Bearer {KEY}"})
    assert status == 404 and set(doc) == {"error"}


def test_root_v1_serves_the_openai_routes(gw, stubs):
    status, doc = gw.get("/v1/models", {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and {m["id"] for m in doc["data"]} >= {"reasoning", QWEN}
    # VS Code Copilot lists models over /api/tags, then chats with those names at the root's /v1
    status, doc = gw.post("/v1/chat/completions", {"model": "reasoning:latest", "messages": user("[stub content=2]")},
                          {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and doc["choices"][0]["message"]["content"] and doc["model"] == "reasoning:latest"


def test_access_log_and_metrics_say_ollama(gw, client):
    seen = len(gw.access_log())  # this test's own line, not an earlier test's
    client.chat(model="reasoning", messages=user("[stub content=2]"))
    rec = wait_for(lambda: [r for r in gw.access_log()[seen:] if r.get("path") == "/api/chat"], 10)
    assert rec[0]["dialect"] == "ollama" and rec[0]["outcome"] == "ok" and rec[0]["model"] == "reasoning"
    status, text = gw.get("/metrics", ADMIN)
    assert 'dialect="ollama"' in text


# -- cancellation, judged by the upstream ------------------------------------------------------------


def test_closing_a_streamed_chat_cancels_the_upstream(client, gw, vllm_stub):
    before = vllm_stub.log_text().count("cancelled")
    seen = len(gw.access_log())
    stream = client.chat(model="reasoning", messages=user("[stub reasoning=0 content=400 delay_ms=30]"), stream=True)
    assert next(stream).message.role == "assistant"
    stream.close()  # the library's generator closes its httpx stream: the connection goes
    wait_for(lambda: vllm_stub.log_text().count("cancelled") == before + 1, 15)
    wait_for(lambda: vllm_stub.stats()["in_flight"] == 0, 15)
    wait_for(lambda: gw.admin(ADMIN)["backends"]["gpu0"]["in_use"] == 0, 15)
    rec = wait_for(lambda: [r for r in gw.access_log()[seen:] if r.get("path") == "/api/chat"], 15)
    assert rec[0]["dialect"] == "ollama" and rec[0]["outcome"] == "cancelled_streaming"


def test_a_client_gone_while_queued_never_reaches_the_upstream(gw, vllm_stub, stubs):
    """Raw socket: send a streamed chat, hang up before anything is written, with the slot busy."""
    held = [ollama.Client(host=gw.url, headers={"Authorization": f"Bearer {KEY}"}).chat(
        model="reasoning", messages=user("[stub content=400 delay_ms=30]"), stream=True) for _ in range(4)]
    for s in held:
        next(s)
    before = len(vllm_stub.requests())
    seen = len(gw.access_log())
    body = json.dumps({"model": "reasoning", "messages": user("queued")}).encode()
    host, port = gw.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: gw.admin(ADMIN)["backends"]["gpu0"]["queued"] == 1, 15)
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            sock.recv(1)  # nothing at all while it waits: no keep-alive line
    rec = wait_for(lambda: [r for r in gw.access_log()[seen:] if r["outcome"] == "cancelled_queued"], 15)
    assert rec[-1]["dialect"] == "ollama"
    for s in held:
        s.close()
    wait_for(lambda: vllm_stub.stats()["in_flight"] == 0, 15)
    assert len(vllm_stub.requests()) == before


def test_tool_arguments_that_are_no_object_end_the_stream_with_an_error(client, gw, vllm_stub):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    seen = len(gw.access_log())
    with pytest.raises(ollama.ResponseError) as exc:
        for _ in client.chat(model="reasoning", messages=user("[stub reasoning=0 tool=lookup args=[1,2]]"),
                             tools=tools, stream=True):
            pass
    assert "not a JSON object" in exc.value.error
    # recorded as the failure it is, never as a complete answer
    rec = wait_for(lambda: [r for r in gw.access_log()[seen:] if r.get("path") == "/api/chat"], 10)
    assert rec[0]["outcome"] == "error_upstream_midstream" and rec[0]["dialect"] == "ollama"
