"""The OpenAI surface through a real gateway in front of real stubs, with the openai SDK and raw HTTP."""

from __future__ import annotations

import json

import openai
import pytest

from conftest import QWEN, R1
from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_data
from stubproc import wait_for


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base, api_key="unused", max_retries=0)


def test_models_lists_configured_client_names(client, gateway):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["reasoning", QWEN]


def test_non_streaming_routes_by_model_and_echoes_the_client_name(client, stubs):
    vllm, ollama = stubs
    r = client.chat.completions.create(model="reasoning", messages=[{"role": "user", "content": "hi"}], max_tokens=64)
    assert r.model == "reasoning"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    seen = vllm.requests()[-1]["body"]
    assert seen["model"] == R1  # the upstream sees its own model name
    assert seen["max_tokens"] == 64
    assert "temperature" not in seen  # nothing the client did not send

    r = client.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": "hi"}])
    assert r.model == QWEN
    assert ollama.requests()[-1]["body"]["model"] == QWEN
    assert vllm.stats()["total"] == 1


def test_stream_relays_every_chunk_with_client_model_and_done(gateway, vllm_stub, stubs):
    body = {"model": "reasoning", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "[stub reasoning=3 content=5]"}]}
    status, headers, raw = post_raw(gateway.base + "/chat/completions", body)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    data = sse_data(raw)
    assert data[-1] == b"[DONE]" and data.count(b"[DONE]") == 1
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["model"] == "reasoning" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasoning = [c["choices"][0]["delta"].get("reasoning") for c in chunks if c["choices"]]
    content = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([r for r in reasoning if r]) == 3
    assert len([c for c in content if c]) == 5
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c and not c["choices"] for c in chunks)  # not asked for: dropped

    # Same request straight to the stub: the gateway changed nothing but the model name.
    status, _, direct = post_raw(vllm_stub.base + "/chat/completions", {**body, "model": R1})
    direct_chunks = [json.loads(d) for d in sse_data(direct)[:-1]]
    strip = lambda cs: [(c["choices"][0]["delta"] if c["choices"] else None) for c in cs]  # noqa: E731
    assert strip(chunks) == strip(direct_chunks)


def test_stream_usage_only_when_asked(client, stubs):
    stream = client.chat.completions.create(
        model=QWEN, messages=[{"role": "user", "content": "[stub content=4]"}], stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 4


def test_continuous_usage_stats_reach_a_vllm_backend_when_asked(client, stubs):
    vllm, _ = stubs
    stream = client.chat.completions.create(
        model="reasoning", messages=[{"role": "user", "content": "[stub reasoning=0 content=3]"}], stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    assert vllm.requests()[-1]["body"]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    with_content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert with_content and all(ch.usage is not None and ch.usage.prompt_tokens > 0 for ch in with_content)


def test_sdk_stream_assembles_text(client, stubs):
    stream = client.chat.completions.create(
        model="reasoning", messages=[{"role": "user", "content": "[stub content=6 reasoning=0]"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text.split()) == 6


def test_unknown_model_is_404_listing_available(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    err = ei.value.body
    assert "gpt-9" in err["message"] and "reasoning" in err["message"] and QWEN in err["message"]
    assert err["type"] == "not_found_error"


@pytest.mark.parametrize(
    "body,param",
    [
        (b"{not json", None),
        (b'{"messages":[{"role":"user","content":"hi"}]}', "model"),
        (b'{"model":"reasoning","messages":"hi"}', "messages"),
        (b'{"model":"reasoning","messages":[{"role":"user","content":5}]}', "messages[0].content"),
        (b'{"model":"reasoning","messages":[{"role":"user","content":"hi"}],"max_tokens":"many"}', "max_tokens"),
        (b'{"model":"reasoning","messages":[{"role":"user","content":"hi"}],"max_tokens":0}', "max_tokens"),
        (b'{"model":"reasoning","messages":[{"role":"wizard","content":"hi"}]}', "messages[0].role"),
        (b'{"model":"reasoning","messages":[]}', "messages"),
    ],
)
def test_bad_input_is_400_naming_the_field(gateway, body, param):
    status, headers, raw = post_raw(gateway.base + "/chat/completions", body)
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"]
    if param:
        assert err["param"] == param and param in err["message"]
    assert headers["request-id"].startswith("req_")


def test_upstream_error_status_is_passed_on(client, stubs):
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(model="reasoning", messages=[{"role": "user", "content": "[stub status=503]"}])
    assert ei.value.status_code == 503
    assert "stub error 503" in ei.value.body["message"]


def test_backend_unreachable_is_502_naming_the_backend(vllm_stub):
    from stubproc import free_port

    cfg = config_for({"dead": f"http://127.0.0.1:{free_port()}/v1"}, {"m": {"backend": "dead"}})
    with Gateway(cfg) as gw:
        c = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as ei:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert ei.value.status_code in (502, 503)
        assert "dead" in ei.value.body["message"]
        assert "127.0.0.1" not in ei.value.body["message"]  # no internal address
        assert gw.admin()["backends"]["dead"]["in_use"] == 0


def test_embeddings_are_routed(client, stubs):
    vllm, _ = stubs
    r = client.embeddings.create(model="reasoning", input=["a", "b"])
    assert r.model == "reasoning" and len(r.data) == 2
    # The stub 404s a model it does not serve, so an answer means the upstream name was sent;
    # and the vectors are the stub's own, unchanged.
    status, _, raw = post_raw(vllm.base + "/embeddings", {"model": R1, "input": ["a", "b"]})
    assert status == 200
    assert [d.embedding for d in r.data] == [d["embedding"] for d in json.loads(raw)["data"]]
    assert vllm.stats()["total"] == 0  # embeddings are not generations


def test_unknown_endpoint_is_a_dialect_404(gateway):
    status, _, raw = post_raw(gateway.base + "/completions-nope", {"x": 1})
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"


def test_access_log_line_per_request(client, gateway, stubs):
    client.chat.completions.create(model="reasoning", messages=[{"role": "user", "content": "[stub content=2]"}])
    line = wait_for(lambda: [x for x in gateway.access_log() if x.get("dialect") == "openai" and x["tokens_out"] == 2 + 8], 5)
    rec = line[-1]
    assert rec["model"] == "reasoning" and rec["backend"] == "gpu0" and rec["status"] == 200 and rec["outcome"] == "ok"
    assert not ({"content", "messages", "prompt"} & set(rec))  # never message text


@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {"model": "reasoning", "messages": [{"role": "user", "content": "[stub content=20 fail_after=3]"}]}),
    ("/messages", {"model": "reasoning", "max_tokens": 64, "messages": [{"role": "user", "content": "[stub content=20 fail_after=3]"}]}),
])
def test_non_streaming_upstream_that_hangs_up_is_a_502_not_a_500(gateway, stubs, path, body):
    status, _, raw = post_raw(gateway.base + path, body)
    assert status == 502, raw
    doc = json.loads(raw)
    message = doc["error"]["message"]
    assert "gpu0" in message and "unreachable" not in message and "Traceback" not in message
    wait_for(lambda: gateway.admin()["backends"]["gpu0"]["in_use"] == 0, 2)
