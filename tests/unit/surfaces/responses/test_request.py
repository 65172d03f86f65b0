"""Responses request -> canonical: Codex's shapes, tools and namespaces, reasoning items, errors
that name the field path, and no exception but GatewayError for any JSON."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import canonical as c
from homelab_frontend.config import Backend
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.surfaces.responses.request import parse_request
from homelab_frontend.surfaces.responses.sealed import ReasoningSealer
from homelab_frontend.upstream.chat_body import build_body

SEALER = ReasoningSealer(ThinkingSigner(b"k"))


def parse(body: dict):
    return parse_request(json.dumps(body).encode(), sealer=SEALER)


def upstream(body: dict, kind: str = "vllm") -> dict:
    p = parse(body)
    req = p.canonical([])
    return msgspec.json.decode(build_body(req, upstream_model="up", backend=Backend(url="http://x/v1", kind=kind),
                                          stream=True, max_tokens=req.max_tokens))


def bad(body: dict) -> GatewayError:
    with pytest.raises(GatewayError) as exc:
        parse(body)
    assert exc.value.kind == "invalid_request"
    assert exc.value.message.startswith(exc.value.param + ": ")
    return exc.value


CODEX_TOOLS = [
    {"type": "function", "name": "shell", "description": "run", "strict": False,
     "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
     "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
               {"type": "function", "name": "shell", "parameters": {"type": "object"}}]},
    {"type": "web_search", "external_web_access": False},
]


def test_codex_first_turn():
    body = {"model": "m", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "tools": CODEX_TOOLS, "input": [
                {"type": "message", "id": "a", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    p = parse(body)
    assert p.stream and not p.store and p.include_encrypted
    assert p.reasoning_effort is None and p.temperature is None and p.max_output_tokens is None
    up = upstream(body)
    assert up["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert [t["function"]["name"] for t in up["tools"]] == ["shell", "multi_agent_v1__spawn_agent", "multi_agent_v1__shell"]
    assert p.names["multi_agent_v1__shell"] == ("multi_agent_v1", "shell")
    assert up["tool_choice"] == "auto" and up["parallel_tool_calls"] is True
    for absent in ("temperature", "top_p", "max_tokens", "stop", "reasoning_effort", "prompt_cache_key", "store"):
        assert absent not in up


def test_flattened_names_never_collide():
    tools = [{"type": "function", "name": "ns__a"},
             {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a"}]}]
    p = parse({"model": "m", "input": "x", "tools": tools})
    assert [t.name for t in p.tools] == ["ns__a", "ns__a_2"]
    assert p.names["ns__a_2"] == ("ns", "a")


def test_history_items_become_one_assistant_turn_and_tool_messages():
    blob = SEALER.seal("I should run ls")
    body = {"model": "m", "tools": CODEX_TOOLS, "input": [
        {"role": "user", "content": "list"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": blob},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
        {"type": "function_call", "id": "fc_1", "status": "completed", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "c1"},
        {"type": "function_call", "name": "spawn_agent", "namespace": "multi_agent_v1", "arguments": "{}", "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
        {"type": "web_search_call", "id": "ws", "status": "completed"},
    ]}
    up = upstream(body)
    assert up["messages"] == [
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "Running.", "reasoning": "I should run ls", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}},
            {"id": "c2", "type": "function", "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]


def test_forged_or_plain_reasoning_is_dropped():
    body = {"model": "m", "input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "fake"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "hlfr1.AAAA"},
        {"type": "reasoning", "summary": [], "encrypted_content": ReasoningSealer(ThinkingSigner(b"other")).seal("x")},
        {"role": "assistant", "content": "a"}]}
    msgs = upstream(body)["messages"]
    assert msgs[1] == {"role": "assistant", "content": "a"}


def test_sampling_reasoning_and_format():
    up = upstream({"model": "m", "input": "x", "instructions": "be brief", "max_output_tokens": 50,
                   "temperature": 0.5, "top_p": 0.9, "reasoning": {"effort": "minimal"}, "user": "u",
                   "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}}})
    assert up["messages"][0] == {"role": "system", "content": "be brief"}
    assert (up["max_tokens"], up["temperature"], up["top_p"], up["reasoning_effort"], up["user"]) == (50, 0.5, 0.9, "low", "u")
    assert up["response_format"] == {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}}
    off = upstream({"model": "m", "input": "x", "reasoning": {"effort": "none"}})
    assert off["chat_template_kwargs"] == {"enable_thinking": False} and "reasoning_effort" not in off


def test_tool_choice_forms():
    base = {"model": "m", "input": "x", "tools": CODEX_TOOLS}
    assert upstream({**base, "tool_choice": {"type": "function", "name": "shell"}})["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
    assert upstream({**base, "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}})["tool_choice"] == "required"
    assert upstream({**base, "tool_choice": {"type": "web_search"}})["tool_choice"] == "auto"
    only_hosted = upstream({"model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": "required"})
    assert "tools" not in only_hosted and "tool_choice" not in only_hosted


def test_images():
    up = upstream({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what"}, {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]}]})
    assert up["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.mark.parametrize("body,param", [
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": 3}, "input"),
    ({"model": "m", "input": [{"role": "user", "content": "a"}, {"type": "message", "role": "user", "content": "b"},
                              {"role": "tool", "content": "x"}]}, "input[2].role"),
    ({"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                              {"role": "user", "content": "c"},
                              {"role": "user", "content": [{"type": "input_audio", "data": ""}]}]}, "input[3].content[0].type"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0].file_id"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"model": "m", "input": [{"type": "item_reference"}]}, "input[0].id"),
    ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice.name"),
    ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
])
def test_errors_name_the_field(body, param):
    assert bad(body).param == param


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4) | st.sampled_from(
        ["message", "function_call", "function_call_output", "reasoning", "input_text", "user", "assistant",
         "developer", "namespace", "function", "json_schema", "input_image"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["type", "role", "content", "text", "name", "call_id", "arguments", "output", "tools", "format",
         "schema", "image_url", "encrypted_content", "namespace", "effort"]), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "input", "tools", "tool_choice", "text", "reasoning", "instructions",
                                        "max_output_tokens", "stream", "store", "include", "temperature"]), json_values))
def test_any_json_is_a_request_or_a_clear_400(raw):
    raw.setdefault("model", "m")
    try:
        p = parse(raw)
    except GatewayError as err:
        assert err.kind == "invalid_request" and err.param and err.message.startswith(err.param)
        return
    req = p.canonical([])
    assert isinstance(req, c.Request)
    build_body(req, upstream_model="up", backend=Backend(url="http://x/v1"), stream=False, max_tokens=req.max_tokens)


@pytest.mark.parametrize("item", [{"type": []}, {"type": {}}, {"type": 1}, {"role": "user", "content": "x", "type": None}])
def test_an_item_type_that_is_not_a_string_is_a_400(item):
    assert bad({"model": "m", "input": [item]}).param == "input[0].type"


def test_item_references_are_collected_then_parsed_as_the_stored_items():
    body = {"model": "m", "input": [{"role": "user", "content": "q"}, {"type": "item_reference", "id": "rs_1"},
                                    {"type": "item_reference", "id": "fc_1"},
                                    {"type": "function_call_output", "call_id": "c1", "output": "o"}]}
    first = parse(body)
    assert first.references == [("input[1].id", "rs_1"), ("input[2].id", "fc_1")]
    stored = {"rs_1": {"id": "rs_1", "type": "reasoning", "summary": [],
                       "content": [{"type": "reasoning_text", "text": "think"}]},
              "fc_1": {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}}
    second = parse_request(json.dumps(body).encode(), sealer=SEALER, resolved=stored)
    assert second.references == []
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[1].reasoning == "think"  # the store's reasoning is the gateway's own: trusted
    assert second.messages[1].tool_calls[0].name == "run"
    assert [i["type"] for i in second.input_items] == ["message", "reasoning", "function_call", "function_call_output"]
    assert second.input_items[0]["content"] == [{"type": "input_text", "text": "q"}]
    # the same reasoning item sent by a client (not from the store) is not trusted
    body["input"][1] = stored["rs_1"]
    assert parse(body).messages[1].reasoning is None
