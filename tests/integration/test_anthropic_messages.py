"""Task 2.11: non-streaming Anthropic Messages through a real gateway, with the official SDK and
raw HTTP, in front of a reasoning (vLLM-like) model and a plain (Ollama-like) one."""

from __future__ import annotations

import json

import anthropic
import pytest

from conftest import QWEN, R1
from rawhttp import post_raw


@pytest.fixture
def client(gateway):
    return anthropic.Anthropic(base_url=gateway.llm, api_key="unused", max_retries=0)


def _post(gateway, body, headers=None):
    status, hdrs, raw = post_raw(gateway.base + "/messages", body, headers)
    return status, hdrs, raw


# -- the seed's Verify commands, as tests ---------------------------------------------------------


def test_verify_reasoning_message_shape(gateway, stubs):
    status, hdrs, raw = _post(gateway, {"model": "reasoning", "max_tokens": 64,
                                        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200
    assert hdrs["content-type"].startswith("application/json")
    doc = json.loads(raw)
    assert doc["type"] == "message" and doc["role"] == "assistant"
    assert [b["type"] for b in doc["content"]] == ["thinking", "text"]
    assert set(doc) == {"id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"}
    assert doc["id"].startswith("msg_")
    assert doc["model"] == "reasoning"
    assert doc["stop_reason"] == "end_turn"
    assert "stop_sequence" in doc and doc["stop_sequence"] is None
    assert doc["content"][0]["thinking"] and doc["content"][0]["signature"]
    assert doc["content"][1]["text"]


def test_verify_no_openai_field_names(gateway, stubs):
    _, _, raw = _post(gateway, {"model": "reasoning", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
    for name in (b'"choices"', b'"finish_reason"', b'"object"'):
        assert name not in raw


def test_verify_max_tokens_on_plain_model(gateway, stubs):
    status, _, raw = _post(gateway, {"model": QWEN, "max_tokens": 4,
                                     "messages": [{"role": "user", "content": "count to fifty"}]})
    assert status == 200
    doc = json.loads(raw)
    assert doc["stop_reason"] == "max_tokens"
    assert set(doc["usage"]) == {"input_tokens", "output_tokens"}
    assert doc["usage"]["output_tokens"] == 4 and doc["usage"]["input_tokens"] > 0
    assert [b["type"] for b in doc["content"]] == ["text"]


# -- more of 2.11 ---------------------------------------------------------------------------------


def test_sdk_create_reasoning(client, stubs):
    vllm, _ = stubs
    msg = client.messages.create(model="reasoning", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert msg.model == "reasoning" and msg.role == "assistant"
    assert msg.content[0].type == "thinking" and msg.content[1].type == "text"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    upstream = vllm.requests()[-1]["body"]
    assert upstream["model"] == R1 and upstream["max_tokens"] == 64
    assert "stop_sequences" not in upstream and "temperature" not in upstream


def test_usage_maps_prompt_and_completion_tokens(client, stubs):
    vllm, _ = stubs
    msg = client.messages.create(model="reasoning", max_tokens=64,
                                 messages=[{"role": "user", "content": "[stub reasoning=3 content=5]"}])
    assert msg.usage.output_tokens == 8
    assert msg.usage.model_dump(exclude_none=True).keys() <= {"input_tokens", "output_tokens"}


def test_no_reasoning_means_no_thinking_block(client, stubs):
    msg = client.messages.create(model="reasoning", max_tokens=64,
                                 messages=[{"role": "user", "content": "[stub reasoning=0 content=3]"}])
    assert [b.type for b in msg.content] == ["text"]


def test_reasoning_without_content_keeps_the_thinking_block(client, stubs):
    msg = client.messages.create(model="reasoning", max_tokens=64,
                                 messages=[{"role": "user", "content": "[stub reasoning=4 content=0]"}])
    assert [b.type for b in msg.content] == ["thinking"]
    assert msg.content[0].thinking


def test_stop_sequence_from_vllm_stop_reason(client, stubs):
    vllm, _ = stubs
    msg = client.messages.create(model="reasoning", max_tokens=64, stop_sequences=["banana"],
                                 messages=[{"role": "user", "content": "[stub text=apple reasoning=0 content=3]"}])
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    msg = client.messages.create(model="reasoning", max_tokens=64, stop_sequences=["demo"],
                                 messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "demo"
    assert "demo" not in msg.content[-1].text
    assert vllm.requests()[-1]["body"]["stop"] == ["demo"]


def test_stop_sequence_on_ollama_is_found_by_the_gateway(client, stubs):
    _, ollama = stubs
    msg = client.messages.create(model=QWEN, max_tokens=64, stop_sequences=["demo"],
                                 messages=[{"role": "user", "content": "hi"}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "demo"
    text = msg.content[0].text
    assert "demo" not in text and text


def test_length_is_max_tokens(client, stubs):
    msg = client.messages.create(model="reasoning", max_tokens=5,
                                 messages=[{"role": "user", "content": "[stub reasoning=2 content=50]"}])
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 5


def test_system_string_blocks_and_system_in_messages(client, stubs):
    vllm, _ = stubs
    client.messages.create(
        model="reasoning", max_tokens=16,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Answer in English."}],
        messages=[{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "hello"},
                  {"role": "system", "content": "Now be brief."},
                  {"role": "user", "content": "again"}],
    )
    msgs = vllm.requests()[-1]["body"]["messages"]
    assert msgs[0] == {"role": "system", "content": "You are terse.\n\nAnswer in English."}
    # the later system turn is merged, wrapped, into the user turn it precedes (upstream/system_turns.py)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[3]["content"] == "<system>\nNow be brief.\n</system>\n\nagain"
    assert "cache_control" not in json.dumps(vllm.requests()[-1]["body"])


def test_tool_use_round_trip(client, stubs):
    vllm, _ = stubs
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msg = client.messages.create(
        model="reasoning", max_tokens=256, tools=tools,
        messages=[{"role": "user", "content": '[stub tool=get_weather args={"city":"Paris"}]'}],
    )
    assert msg.stop_reason == "tool_use"
    use = [b for b in msg.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    sent = vllm.requests()[-1]["body"]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tools"][0]["function"]["parameters"]["required"] == ["city"]

    follow = client.messages.create(
        model="reasoning", max_tokens=64, tools=tools,
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny", "is_error": False},
                                         {"type": "text", "text": "thanks"}]},
        ],
    )
    assert follow.stop_reason == "end_turn"
    up = vllm.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in up] == ["user", "assistant", "tool", "user"]
    assert up[1]["tool_calls"][0]["id"] == use.id
    assert json.loads(up[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert up[2]["tool_call_id"] == use.id and "sunny" in json.dumps(up[2]["content"])
    # our own signed thinking went back as reasoning, never as visible text
    assert up[1].get("reasoning") and up[1]["reasoning"] not in json.dumps(up[1]["content"])


def test_tool_error_result_is_marked(client, stubs):
    vllm, _ = stubs
    client.messages.create(
        model="reasoning", max_tokens=16,
        tools=[{"name": "Bash", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": "go"},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "false"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "exit 1", "is_error": True}]}],
    )
    tool_msg = vllm.requests()[-1]["body"]["messages"][2]
    assert tool_msg["role"] == "tool" and "error" in json.dumps(tool_msg["content"]).lower()


def test_ollama_tool_call_whole_in_one_delta(client, stubs):
    msg = client.messages.create(
        model=QWEN, max_tokens=64,
        tools=[{"name": "lookup", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
        messages=[{"role": "user", "content": '[stub tool=lookup args={"q":"x"}]'}],
    )
    assert msg.stop_reason == "tool_use"
    assert [b.input for b in msg.content if b.type == "tool_use"] == [{"q": "x"}]


def test_max_tokens_above_context_is_clamped(gateway, stubs):
    vllm, _ = stubs
    status, _, raw = _post(gateway, {"model": "reasoning", "max_tokens": 64000,
                                     "messages": [{"role": "user", "content": "[stub reasoning=1 content=2]"}]})
    assert status == 200, raw
    assert json.loads(raw)["stop_reason"] == "end_turn"
    assert vllm.requests()[-1]["body"]["max_tokens"] < 4096


def test_count_tokens_uses_the_backend_tokenizer(client, gateway, stubs):
    r = client.messages.count_tokens(model="reasoning", messages=[{"role": "user", "content": "one two three"}])
    assert r.input_tokens > 0
    # the same messages straight through the stub's /tokenize
    status, _, raw = post_raw(stubs[0].url + "/tokenize", {"model": R1, "messages": [{"role": "user", "content": "one two three"}]})
    assert status == 200 and json.loads(raw)["count"] == r.input_tokens


def test_alias_resolves_and_echoes_client_name(client, stubs):
    vllm, ollama = stubs
    msg = client.messages.create(model="claude-haiku-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert msg.model == "claude-haiku-4-5"
    assert ollama.stats()["total"] == 1
    msg = client.messages.create(model="claude-opus-4-8", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert msg.model == "claude-opus-4-8" and vllm.stats()["total"] == 1


# -- errors in the Anthropic envelope ---------------------------------------------------------------


@pytest.mark.parametrize(
    "body,status,etype,needle",
    [
        (b"{nope", 400, "invalid_request_error", "JSON"),
        ({"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "reasoning", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "reasoning", "max_tokens": 5, "messages": [{"role": "user", "content": 7}]}, 400, "invalid_request_error", "messages[0].content"),
        ({"model": "reasoning", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, 400, "invalid_request_error", "hologram"),
        ({"model": "gpt-9", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, 404, "not_found_error", "gpt-9"),
    ],
)
def test_errors_in_anthropic_envelope(gateway, stubs, body, status, etype, needle):
    got, hdrs, raw = _post(gateway, body)
    assert got == status, raw
    doc = json.loads(raw)
    assert doc["type"] == "error" and doc["error"]["type"] == etype
    assert needle in doc["error"]["message"]
    assert hdrs["request-id"].startswith("req_")
    assert "Traceback" not in doc["error"]["message"]


def test_upstream_error_in_anthropic_envelope(client, stubs):
    with pytest.raises(anthropic.APIStatusError) as ei:
        client.messages.create(model="reasoning", max_tokens=5, messages=[{"role": "user", "content": "[stub status=503]"}])
    assert ei.value.status_code in (503, 529)
    assert ei.value.body["type"] == "error" and "stub error 503" in ei.value.body["error"]["message"]


def test_beta_query_and_headers_accepted(gateway, stubs):
    status, _, raw = post_raw(
        gateway.base + "/messages?beta=true",
        {"model": "reasoning", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
         "context_management": {"edits": []}, "metadata": {"user_id": "u1"}},
        {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14,context-management-2025-06-27"},
    )
    assert status == 200, raw
    assert stubs[0].requests()[-1]["body"].get("user") == "u1"
