"""The Ollama request parser: the bodies the official libraries and Open WebUI send, each rule of
the module docstring, and a fuzz that nothing but a GatewayError ever escapes."""

from __future__ import annotations

import base64
import json

import httpx
import ollama
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.ollama.request import parse_chat, parse_generate

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 20).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 20).decode()


def chat(**body) -> c.Request:
    body.setdefault("model", "m")
    call = parse_chat(json.dumps(body).encode())
    assert call.request is not None
    return call.request


def refused(fn, body: dict) -> GatewayError:
    with pytest.raises(GatewayError) as exc:
        fn(json.dumps(body).encode())
    assert exc.value.kind == "invalid_request"
    assert exc.value.message.startswith(f"{exc.value.param}: ") if exc.value.param else True
    return exc.value


def test_the_python_librarys_own_body():
    # exactly what ollama.Client.chat sends (captured from its transport): stream and "tools": []
    # always, no empty content
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200, json={"model": "m", "message": {"role": "assistant", "content": ""}, "done": True})

    client = ollama.Client(host="http://gateway.test", transport=httpx.MockTransport(handler))
    client.chat(
        model="reasoning:latest",
        messages=[{"role": "user", "content": "hi"},
                  ollama.Message(role="assistant", tool_calls=[ollama.Message.ToolCall(
                      function=ollama.Message.ToolCall.Function(name="get_weather", arguments={"city": "Paris"}))]),
                  {"role": "tool", "content": "12 C", "tool_name": "get_weather"}],
        think=True, options={"temperature": 0.2, "num_predict": 64},
    )
    body = json.loads(sent[0])
    assert body["tools"] == [] and body["stream"] is False and "content" not in body["messages"][1]
    call = parse_chat(sent[0])
    req = call.request
    assert call.stream is False and call.model == "reasoning:latest" and req.model == "reasoning:latest"
    assert req.tools == [] and req.reasoning_enabled is True and req.reasoning_effort is None
    assert req.temperature == 0.2 and req.max_tokens == 64
    asst, tool = req.messages[1], req.messages[2]
    assert asst.parts == [] and asst.tool_calls == [c.ToolCall("call_1_0", "get_weather", '{"city":"Paris"}')]
    assert tool.role == "tool" and tool.tool_call_id == "call_1_0" and tool.text() == "12 C"


def test_stream_defaults_to_true():
    assert parse_chat(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}').stream is True
    assert parse_generate(b'{"model": "m", "prompt": "x"}').request.stream is True


def test_ids_are_honoured_when_sent_and_tool_names_match_calls_in_order():
    req = chat(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [
            {"id": "call_A", "function": {"name": "f", "arguments": {}}},
            {"function": {"name": "g", "arguments": '{"x": 1}'}},
            {"function": {"name": "f", "arguments": {"y": 2}}}]},
        {"role": "tool", "tool_name": "f", "content": "1"},
        {"role": "tool", "tool_name": "f", "content": "2"},
        {"role": "tool", "tool_call_id": "call_1_1", "content": "3"},
        {"role": "tool", "content": "orphan"},
    ])
    ids = [m.tool_call_id for m in req.messages if m.role == "tool"]
    assert ids == ["call_A", "call_1_2", "call_1_1", "call_5"]
    assert req.messages[1].tool_calls[1].arguments == '{"x": 1}'


def test_ids_are_stable_across_turns_for_the_prefix_cache():
    turn = [{"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "tool_name": "f", "content": "1"}]
    a = chat(messages=turn)
    b = chat(messages=turn + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}])
    assert b.messages[:3] == a.messages


def test_images_become_data_urls_with_sniffed_types():
    req = chat(messages=[{"role": "user", "content": "what is this", "images": [PNG, JPEG, "data:image/webp;base64,UklGRg=="]}])
    urls = [p.url for p in req.messages[0].parts if isinstance(p, c.ImagePart)]
    assert urls == [f"data:image/png;base64,{PNG}", f"data:image/jpeg;base64,{JPEG}", "data:image/webp;base64,UklGRg=="]
    err = refused(parse_chat, {"model": "m", "messages": [{"role": "user", "images": ["not base64!!"]}]})
    assert err.param == "messages[0].images[0]"


def test_think_levels_and_refusals():
    r = chat(messages=[{"role": "user", "content": "x"}], think="high")
    assert r.reasoning_enabled is True and r.reasoning_effort == "high"
    r = chat(messages=[{"role": "user", "content": "x"}], think=False)
    assert r.reasoning_enabled is False and r.reasoning_effort is None
    assert refused(parse_chat, {"model": "m", "messages": [], "think": "max"}).param == "think"


def test_format_json_and_schema():
    r = chat(messages=[{"role": "user", "content": "x"}], format="json")
    assert r.extra["response_format"] == {"type": "json_object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = chat(messages=[{"role": "user", "content": "x"}], format=schema)
    assert r.extra["response_format"] == {"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}
    assert "response_format" not in chat(messages=[{"role": "user", "content": "x"}], format="").extra
    assert refused(parse_chat, {"model": "m", "messages": [], "format": "yaml"}).param == "format"


def test_options():
    r = chat(messages=[{"role": "user", "content": "x"}], options={
        "temperature": 0, "top_p": 0.9, "top_k": 40, "num_predict": -1, "stop": ["\n\n", ""], "seed": 7,
        "num_ctx": 8192, "mirostat": 2, "repeat_penalty": 1.1, "presence_penalty": 0.5})
    assert (r.temperature, r.top_p, r.top_k, r.max_tokens, r.stop) == (0.0, 0.9, 40, None, ["\n\n"])
    assert r.extra == {"seed": 7, "presence_penalty": 0.5}  # num_ctx, mirostat...: accepted, not sent
    assert chat(messages=[{"role": "user", "content": "x"}], options={"stop": "END"}).stop == ["END"]
    for opts, param in [({"temperature": "hot"}, "options.temperature"), ({"num_predict": 0}, "options.num_predict"),
                        ({"top_p": 2}, "options.top_p"), ({"seed": 1.5}, "options.seed"), ({"stop": [1]}, "options.stop[0]")]:
        assert refused(parse_chat, {"model": "m", "messages": [], "options": opts}).param == param
    assert refused(parse_chat, {"model": "m", "messages": [], "options": []}).param == "options"


def test_tools():
    r = chat(messages=[{"role": "user", "content": "x"}], tools=[
        {"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}])
    assert r.tools == [c.Tool("get_weather", "d", {"type": "object"})]
    assert refused(parse_chat, {"model": "m", "messages": [], "tools": [{"function": {}}]}).param == "tools[0].function.name"


def test_bad_fields_are_named():
    cases = [
        ({"messages": []}, "model"),
        ({"model": "", "messages": []}, "model"),
        ({"model": "m", "messages": {}}, "messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
        ({"model": "m", "messages": [], "stream": "yes"}, "stream"),
        ({"model": "m", "messages": [], "keep_alive": {}}, "keep_alive"),
    ]
    for body, param in cases:
        assert refused(parse_chat, body).param == param
    with pytest.raises(GatewayError) as exc:
        parse_chat(b"{not json")
    assert exc.value.kind == "invalid_request"


def test_empty_chat_and_generate_only_load_and_keep_alive_zero_unloads():
    call = parse_chat(b'{"model": "m", "messages": []}')
    assert call.request is None and not call.unload
    call = parse_generate(b'{"model": "m", "prompt": "", "keep_alive": 0}')  # Open WebUI's unload
    assert call.request is None and call.unload
    assert parse_generate(b'{"model": "m", "keep_alive": "5m"}').keep_alive == 300.0


def test_generate_prompt_system_images():
    call = parse_generate(json.dumps({"model": "m", "prompt": "why", "system": "be brief", "images": [PNG],
                                      "options": {"num_predict": 8}, "context": []}).encode())
    req = call.request
    assert call.endpoint == "generate" and req.max_tokens == 8
    assert [m.role for m in req.messages] == ["system", "user"]
    assert req.messages[0].text() == "be brief" and req.messages[1].text() == "why"
    assert isinstance(req.messages[1].parts[1], c.ImagePart)


@pytest.mark.parametrize("body,param", [
    ({"raw": True, "images": ["iVBORw0KGgo="]}, "images"),
    ({"suffix": "}", "format": "json"}, "format"),
    ({"context": [1, 2, 3]}, "context"),
    ({"template": "{{ .Prompt }}"}, "template"),
])
def test_generate_refuses_what_a_chat_completion_cannot_honour(body, param):
    err = refused(parse_generate, {"model": "m", "prompt": "x", **body})
    assert err.param == param and "gateway" in err.message


def test_generate_raw_and_suffix_are_completions_with_the_same_options():
    call = parse_generate(json.dumps({"model": "m", "prompt": "<fim_prefix>x", "raw": True, "system": "ignored",
                                      "options": {"num_predict": 16, "temperature": 0.1, "stop": ["\n"], "seed": 3,
                                                  "num_ctx": 4096}}).encode())
    assert call.text is not None and call.text.suffix is None and call.text.prompt == "<fim_prefix>x"
    assert call.text.params == {"max_tokens": 16, "temperature": 0.1, "stop": ["\n"], "seed": 3}
    assert call.text.stream  # Ollama's default
    # Twinny / ollama-autocoder style: prompt + suffix, not raw (Ollama fills its template)
    call = parse_generate(json.dumps({"model": "m", "prompt": "def f(", "suffix": "    return 1",
                                      "stream": False}).encode())
    assert call.text.suffix == "    return 1" and not call.text.stream
    assert parse_generate(b'{"model": "m", "prompt": "", "raw": true}').request is None  # a load


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["model", "messages", "role", "content", "images", "tool_calls", "function", "name", "arguments",
         "tools", "think", "format", "options", "stop", "num_predict", "prompt", "system", "keep_alive", "stream"]),
        inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(json_values, st.sampled_from([parse_chat, parse_generate]))
def test_fuzz_only_gateway_errors_escape(value, fn):
    try:
        fn(json.dumps(value).encode())
    except GatewayError as err:
        assert err.kind == "invalid_request" and err.status == 400
