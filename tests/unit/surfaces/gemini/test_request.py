"""Gemini request parser: each rule of request.py's docstring, the SDK's own request shapes, and a
fuzz property (any JSON gives a Request or a GatewayError naming a field, nothing else)."""

from __future__ import annotations

import base64
import json

import pytest
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.gemini.request import parse_request
from homelab_frontend.surfaces.gemini.rules import signature_for
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"test-secret")
USER = {"role": "user", "parts": [{"text": "hi"}]}


def parse(body: dict, *, model: str = "gemini-2.5-flash", stream: bool = False) -> c.Request:
    return parse_request(json.dumps(body).encode(), model=model, stream=stream, signer=SIGNER)


def refused(body, field: str | None = None, *, raw: bytes | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        if raw is not None:
            parse_request(raw, model="m", stream=False, signer=SIGNER)
        else:
            parse(body)
    err = info.value
    assert err.kind == "invalid_request" and err.status == 400
    if field is not None:
        assert err.param == field and err.message.startswith(field + ":"), err.message
    return err


# ---------------------------------------------------------------------------------------------
# Contents
# ---------------------------------------------------------------------------------------------


def test_a_plain_turn_and_the_system_instruction():
    req = parse({"contents": [USER], "systemInstruction": {"role": "user", "parts": [{"text": "Be brief."}, {"text": "Be kind."}]}},
                stream=True)
    assert req.model == "gemini-2.5-flash" and req.stream
    assert [(m.role, m.text()) for m in req.messages] == [("system", "Be brief.\n\nBe kind."), ("user", "hi")]
    assert parse({"contents": [USER], "system_instruction": "Plain."}).messages[0].text() == "Plain."
    # a content without a role is the user's (single-turn requests); the legacy role "function" too
    assert parse({"contents": [{"parts": [{"text": "x"}]}]}).messages[0].role == "user"


def test_roles_and_shapes_are_checked():
    refused({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "contents[0].role")
    refused({"contents": "hi"}, "contents")
    refused({"contents": [USER, 3]}, "contents[1]")
    refused({"contents": [{"role": "user", "parts": [{"text": 3}]}]}, "contents[0].parts[0].text")
    refused({"contents": [{"role": "user", "parts": [{"bogus": 1}]}]}, "contents[0].parts[0]")
    refused({"contents": []}, "contents")
    refused({"systemInstruction": {"parts": [{"text": "s"}]}}, "contents")  # nothing but a system turn
    refused({"contents": [USER], "systemInstruction": {"parts": [{"inlineData": {}}]}}, "systemInstruction.parts[0]")
    refused(None, raw=b"")
    refused(None, raw=b"[1]")
    refused(None, raw=b"{nope")


def test_images_text_files_and_unsupported_media():
    png = base64.b64encode(b"\x89PNG").decode()
    txt = base64.b64encode("héllo".encode()).decode()
    req = parse({"contents": [{"role": "user", "parts": [
        {"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": png}},
        {"inline_data": {"mime_type": "text/plain", "data": txt}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/cat.jpg"}}]}]})
    parts = req.messages[0].parts
    assert parts == [c.TextPart("look"), c.ImagePart(f"data:image/png;base64,{png}"), c.TextPart("héllo"),
                     c.ImagePart("https://example.com/cat.jpg")]
    refused({"contents": [{"parts": [{"inlineData": {"mimeType": "application/pdf", "data": png}}]}]},
            "contents[0].parts[0].inlineData.mimeType")
    refused({"contents": [{"parts": [{"fileData": {"mimeType": "image/png", "fileUri": "files/abc"}}]}]},
            "contents[0].parts[0].fileData.fileUri")
    refused({"contents": [{"role": "model", "parts": [{"inlineData": {"mimeType": "image/png", "data": png}}]}]},
            "contents[0].parts[0]")


def test_thought_parts_hosted_code_parts_and_empty_text_are_dropped():
    req = parse({"contents": [USER, {"role": "model", "parts": [
        {"text": "secret", "thought": True}, {"executableCode": {"code": "1"}}, {"codeExecutionResult": {}},
        {"text": ""}, {"text": "answer"}]}, {"role": "user", "parts": [{"text": "more"}]}]})
    assert [(m.role, m.text(), m.reasoning) for m in req.messages] == [
        ("user", "hi", None), ("assistant", "answer", None), ("user", "more", None)]


# ---------------------------------------------------------------------------------------------
# Function calls, responses and their matching
# ---------------------------------------------------------------------------------------------


def _call_turn(*calls):
    return {"role": "model", "parts": [{"functionCall": fc} for fc in calls]}


def test_responses_match_calls_by_id_then_by_name_and_order():
    req = parse({"contents": [
        USER,
        _call_turn({"id": "run_shell_command__c1", "name": "run_shell_command", "args": {"command": "ls"}},
                   {"name": "read_file", "args": {"path": "a"}}, {"name": "read_file", "args": {"path": "b"}}),
        {"role": "user", "parts": [
            {"functionResponse": {"name": "read_file", "response": {"output": "A"}}},
            {"functionResponse": {"id": "run_shell_command__c1", "name": "run_shell_command", "response": {"output": "files"}}},
            {"functionResponse": {"id": "unknown", "name": "read_file", "response": {"error": "no such file"}}},
            {"text": "and then?"}]}]})
    _, asst, t1, t2, t3, user = req.messages
    assert [tc.id for tc in asst.tool_calls] == ["run_shell_command__c1", "call_1_1", "call_1_2"]
    assert json.loads(asst.tool_calls[0].arguments) == {"command": "ls"}
    assert (t1.role, t1.tool_call_id, t1.text()) == ("tool", "call_1_1", "A")
    assert (t2.tool_call_id, t2.text()) == ("run_shell_command__c1", "files")
    assert (t3.tool_call_id, t3.text()) == ("call_1_2", "[tool error] no such file")
    assert (user.role, user.text()) == ("user", "and then?")


def test_generated_call_ids_are_stable_across_turns():
    body = {"contents": [USER, _call_turn({"name": "f", "args": {}}),
                         {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "1"}}}]}]}
    first = parse(body)
    body["contents"] += [{"role": "model", "parts": [{"text": "done"}]}, {"role": "user", "parts": [{"text": "again"}]}]
    second = parse(body)
    assert first.messages[1].tool_calls == second.messages[1].tool_calls
    assert first.messages[2].tool_call_id == second.messages[2].tool_call_id == "call_1_0"


def test_a_response_to_no_call_becomes_user_text_and_other_results_are_json():
    req = parse({"contents": [USER, {"role": "user", "parts": [
        {"functionResponse": {"name": "lookup", "response": {"rows": [1, 2]}}}]}]})
    assert req.messages[-1].role == "user" and req.messages[-1].text() == 'Result of lookup: {"rows":[1,2]}'
    refused({"contents": [_call_turn({"name": "f", "args": "x"})]}, "contents[0].parts[0].functionCall.args")
    refused({"contents": [_call_turn({"args": {}})]}, "contents[0].parts[0].functionCall.name")
    refused({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]}, "contents[0].parts[0].functionCall")
    refused({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": [1]}}]}]},
            "contents[0].parts[0].functionResponse.response")


# ---------------------------------------------------------------------------------------------
# thoughtSignature
# ---------------------------------------------------------------------------------------------


def test_a_gateway_signature_brings_the_reasoning_back_and_a_forged_one_is_dropped():
    sig = signature_for(SIGNER, "I should list files.")
    other = signature_for(ThinkingSigner(b"another-gateway"), "not ours")
    req = parse({"contents": [USER, {"role": "model", "parts": [
        {"functionCall": {"name": "f", "args": {}}, "thoughtSignature": sig},
        {"functionCall": {"name": "g", "args": {}}, "thought_signature": sig}]},  # the same one twice: once
        {"role": "user", "parts": [{"text": "next"}]},
        {"role": "model", "parts": [{"text": "x", "thoughtSignature": other}, {"text": "y", "thoughtSignature": "skip_thought_signature_validator"},
                                    {"thoughtSignature": base64.b64encode(b"hlf2.forged").decode()}]}]})
    assert req.messages[1].reasoning == "I should list files."
    assert req.messages[3].reasoning is None and req.messages[3].parts == [c.TextPart("x"), c.TextPart("y")]


def test_the_python_sdk_round_trip_keeps_the_signature_valid():
    sig = signature_for(SIGNER, "because")
    content = types.Content.model_validate({"role": "model", "parts": [{"text": "ok", "thoughtSignature": sig}]})
    sent = content.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert sent["parts"][0]["thoughtSignature"] == sig  # bytes to the SDK, the same text on the wire
    assert parse({"contents": [USER, sent]}).messages[1].reasoning == "because"


# ---------------------------------------------------------------------------------------------
# Tools and toolConfig
# ---------------------------------------------------------------------------------------------

DECLS = [
    {"name": "run_shell_command", "description": "Run a command",
     "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}, "required": ["command"]}},
    {"name": "read_file", "parameters_json_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "noargs"},
]


def test_function_declarations_both_schema_fields_and_hosted_tools_dropped():
    req = parse({"contents": [USER], "tools": [{"googleSearch": {}}, {"functionDeclarations": DECLS}, {"codeExecution": {}},
                                               {"url_context": {}}]})
    assert [t.name for t in req.tools] == ["run_shell_command", "read_file", "noargs"]
    assert req.tools[0].description == "Run a command"
    assert req.tools[0].parameters == {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    assert req.tools[1].parameters["properties"]["path"] == {"type": "string"}
    assert req.tools[2].parameters == {"type": "object", "properties": {}}
    assert req.tool_choice is None
    only_hosted = parse({"contents": [USER], "tools": [{"googleSearch": {}}], "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}})
    assert only_hosted.tools == [] and only_hosted.tool_choice is None


def test_declaration_errors_name_the_field():
    refused({"contents": [USER], "tools": [{"functionDeclarations": [{"description": "x"}]}]}, "tools[0].functionDeclarations[0].name")
    refused({"contents": [USER], "tools": [{"functionDeclarations": [DECLS[0], DECLS[0]]}]}, "tools[0].functionDeclarations[1].name")
    refused({"contents": [USER], "tools": [{"functionDeclarations": [{"name": "a", "parameters": {}, "parametersJsonSchema": {}}]}]},
            "tools[0].functionDeclarations[0].parametersJsonSchema")
    refused({"contents": [USER], "tools": [{"functionDeclarations": [{"name": "a", "parameters": "x"}]}]},
            "tools[0].functionDeclarations[0].parameters")


@pytest.mark.parametrize("config,choice,names", [
    ({"mode": "AUTO"}, c.ToolChoice("auto"), ["run_shell_command", "read_file", "noargs"]),
    ({"mode": "any"}, c.ToolChoice("required"), ["run_shell_command", "read_file", "noargs"]),
    ({"mode": "NONE"}, c.ToolChoice("none"), ["run_shell_command", "read_file", "noargs"]),
    ({"mode": "VALIDATED"}, c.ToolChoice("auto"), ["run_shell_command", "read_file", "noargs"]),
    ({"mode": "ANY", "allowedFunctionNames": ["read_file"]}, c.ToolChoice("named", "read_file"), ["read_file"]),
    ({"mode": "ANY", "allowed_function_names": ["read_file", "noargs"]}, c.ToolChoice("required"), ["read_file", "noargs"]),
    ({}, None, ["run_shell_command", "read_file", "noargs"]),
])
def test_function_calling_config(config, choice, names):
    req = parse({"contents": [USER], "tools": [{"functionDeclarations": DECLS}], "tool_config": {"function_calling_config": config}})
    assert req.tool_choice == choice and [t.name for t in req.tools] == names


def test_function_calling_config_errors():
    body = {"contents": [USER], "tools": [{"functionDeclarations": DECLS}]}
    refused({**body, "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}}, "toolConfig.functionCallingConfig.mode")
    refused({**body, "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}}},
            "toolConfig.functionCallingConfig.allowedFunctionNames[0]")


# ---------------------------------------------------------------------------------------------
# generationConfig
# ---------------------------------------------------------------------------------------------


def test_sampling_both_spellings_and_top_k_as_a_float():
    req = parse({"contents": [USER], "generationConfig": {"temperature": 0.2, "top_p": 0.9, "topK": 40.0, "maxOutputTokens": 64,
                                                          "stop_sequences": ["END"], "seed": 7, "presencePenalty": 0.5,
                                                          "candidateCount": 1}})
    assert (req.temperature, req.top_p, req.top_k, req.max_tokens, req.stop) == (0.2, 0.9, 40, 64, ["END"])
    assert isinstance(req.top_k, int)
    assert req.extra == {"seed": 7, "presence_penalty": 0.5}
    bare = parse({"contents": [USER]})
    assert (bare.temperature, bare.top_p, bare.top_k, bare.max_tokens, bare.extra) == (None, None, None, None, {})


@pytest.mark.parametrize("gen,field", [
    ({"candidateCount": 2}, "generationConfig.candidateCount"),
    ({"topK": 4.5}, "generationConfig.topK"),
    ({"temperature": -1}, "generationConfig.temperature"),
    ({"topP": 1.5}, "generationConfig.topP"),
    ({"maxOutputTokens": 0}, "generationConfig.maxOutputTokens"),
    ({"temperature": "hot"}, "generationConfig.temperature"),
    ({"stopSequences": [""]}, "generationConfig.stopSequences[0]"),
    ({"responseMimeType": "text/x.enum"}, "generationConfig.responseMimeType"),
    ({"responseModalities": ["IMAGE"]}, "generationConfig.responseModalities"),
    ({"responseSchema": "object"}, "generationConfig.responseSchema"),
])
def test_generation_config_errors_name_the_field(gen, field):
    refused({"contents": [USER], "generationConfig": gen}, field)


def test_json_output_and_schemas_become_response_format():
    schema = {"type": "OBJECT", "properties": {"complexity_reasoning": {"type": "STRING"}, "complexity_score": {"type": "INTEGER"}},
              "required": ["complexity_reasoning", "complexity_score"]}
    want = {"type": "json_schema", "json_schema": {"name": "response", "schema": {
        "type": "object", "properties": {"complexity_reasoning": {"type": "string"}, "complexity_score": {"type": "integer"}},
        "required": ["complexity_reasoning", "complexity_score"]}}}
    for key in ("responseJsonSchema", "response_json_schema", "responseSchema"):
        req = parse({"contents": [USER], "generationConfig": {"responseMimeType": "application/json", key: schema}})
        assert req.extra["response_format"] == want, key
    assert parse({"contents": [USER], "generationConfig": {"responseMimeType": "application/json"}}).extra == {
        "response_format": {"type": "json_object"}}
    assert parse({"contents": [USER], "generationConfig": {"responseMimeType": "text/plain"}}).extra == {}


@pytest.mark.parametrize("thinking,enabled,effort,hidden", [
    (None, None, None, True),
    ({"includeThoughts": True}, None, None, False),
    ({"include_thoughts": True, "thinking_budget": 0}, False, None, False),
    ({"thinkingBudget": -1}, True, None, True),
    ({"thinkingBudget": 1024}, True, "low", True),
    ({"thinkingBudget": 8192}, True, "medium", True),
    ({"thinkingBudget": 24576}, True, "high", True),
    ({"thinkingBudget": 1024, "thinkingLevel": "HIGH"}, True, "high", True),
    ({"thinkingLevel": "minimal"}, True, "low", True),
    ({"thinkingBudget": "lots", "thinkingLevel": 3}, None, None, True),  # malformed: ignored
])
def test_thinking_config(thinking, enabled, effort, hidden):
    gen = {"thinkingConfig": thinking} if thinking is not None else {}
    req = parse({"contents": [USER], "generationConfig": gen})
    assert (req.reasoning_enabled, req.reasoning_effort, req.reasoning_hidden) == (enabled, effort, hidden)


def test_safety_settings_ignored_and_cached_content_refused():
    req = parse({"contents": [USER], "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
                 "labels": {"a": "b"}})
    assert req.messages[0].text() == "hi"
    err = refused({"contents": [USER], "cachedContent": "cachedContents/abc"}, "cachedContent")
    assert "not supported" in err.message


def test_what_the_sdk_itself_sends_parses():
    """The request google-genai builds for a call with tools, thinking and a schema, captured
    from the SDK's own transport."""
    from tests.unit.surfaces.gemini.sdk_oracle import _BOX, client

    _BOX["raw"] = b'{"candidates": []}'
    client().models.generate_content(
        model="gemini-2.5-pro", contents=["What is the weather?"],
        config=types.GenerateContentConfig(
            system_instruction="You are terse.", temperature=0.3, top_k=20, max_output_tokens=100,
            thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=2048),
            safety_settings=[types.SafetySetting(category="HARM_CATEGORY_HARASSMENT", threshold="BLOCK_NONE")],
            tools=[types.Tool(function_declarations=[types.FunctionDeclaration(
                name="get_weather", description="Weather", parameters=types.Schema(
                    type="OBJECT", properties={"city": types.Schema(type="STRING", nullable=True)}, required=["city"]))])],
            tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY"))))
    sent = _BOX["request"]
    assert sent.url.path == "/llm/v1/models/gemini-2.5-pro:generateContent"
    req = parse(json.loads(sent.content))
    assert [m.role for m in req.messages] == ["system", "user"]
    assert (req.temperature, req.top_k, req.max_tokens) == (0.3, 20, 100)
    assert (req.reasoning_enabled, req.reasoning_effort, req.reasoning_hidden) == (True, "low", False)
    assert req.tools[0].parameters == {"type": "object", "properties": {"city": {"type": ["string", "null"]}}, "required": ["city"]}
    assert req.tool_choice == c.ToolChoice("required")


# ---------------------------------------------------------------------------------------------
# Fuzz
# ---------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.sampled_from(
        ["", "user", "model", "OBJECT", "ANY", "image/png", "text/plain", "application/json", "aGk=", "hi"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["contents", "role", "parts", "text", "thought", "functionCall", "functionResponse", "name", "args", "id",
         "response", "inlineData", "mimeType", "data", "tools", "functionDeclarations", "parameters", "type",
         "properties", "toolConfig", "functionCallingConfig", "mode", "allowedFunctionNames", "generationConfig",
         "topK", "candidateCount", "thinkingConfig", "thinkingBudget", "responseSchema", "responseMimeType",
         "systemInstruction", "thoughtSignature", "nullable", "items", "fileData", "fileUri"]), inner, max_size=4),
    max_leaves=25)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["contents", "tools", "toolConfig", "generationConfig", "systemInstruction"]),
                       json_values, max_size=5))
def test_property_any_json_is_a_request_or_a_clear_400(body):
    try:
        req = parse(body)
    except GatewayError as err:
        assert err.kind == "invalid_request" and err.status == 400 and err.message
        if err.param:
            assert err.message.startswith(err.param + ":")
        return
    assert isinstance(req, c.Request) and any(m.role != "system" for m in req.messages)
    for m in req.messages:
        for tc in m.tool_calls:
            assert isinstance(json.loads(tc.arguments), dict)
