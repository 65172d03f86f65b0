"""Anthropic Messages request -> canonical Request (surfaces/anthropic/request.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.anthropic.request import parse_request
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"unit-test-secret")
OTHER_SIGNER = ThinkingSigner(b"someone-else")


def parse(body: dict | bytes) -> c.Request:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request(raw, signer=SIGNER)


def base(**over: Any) -> dict:
    body: dict[str, Any] = {
        "model": "reasoning",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    }
    body.update(over)
    return body


def error_of(body: dict | bytes) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse(body)
    err = info.value
    assert err.kind == "invalid_request"
    assert err.status == 400
    return err


# ---------------------------------------------------------------------------------------------
# Required fields and body-level errors
# ---------------------------------------------------------------------------------------------


def test_minimal_request() -> None:
    req = parse(base())
    assert req.model == "reasoning"
    assert req.max_tokens == 64
    assert req.stream is False
    assert req.messages == [c.Message(role="user", parts=[c.TextPart("hi")])]
    # nothing invented
    assert req.temperature is None and req.top_p is None and req.top_k is None
    assert req.stop == [] and req.tools == [] and req.tool_choice is None
    assert req.parallel_tool_calls is None and req.user is None
    assert req.reasoning_enabled is None and req.reasoning_effort is None
    assert req.extra == {}


def test_stream_flag() -> None:
    assert parse(base(stream=True)).stream is True
    assert parse(base(stream=False)).stream is False
    assert parse(base(stream=None)).stream is False
    err = error_of(base(stream="yes"))
    assert err.param == "stream"
    assert err.message == "stream: expected a boolean, got a string"


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model", "required"),
        (base(model=""), "model", "non-empty"),
        (base(model=7), "model", "expected a string, got an integer"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens", "required"),
        (base(max_tokens=0), "max_tokens", ">= 1"),
        (base(max_tokens=-3), "max_tokens", ">= 1"),
        (base(max_tokens=1.5), "max_tokens", "expected an integer, got a number"),
        (base(max_tokens=True), "max_tokens", "expected an integer, got a boolean"),
        (base(max_tokens="64"), "max_tokens", "expected an integer, got a string"),
        ({"model": "m", "max_tokens": 5}, "messages", "required"),
        (base(messages=[]), "messages", "non-empty"),
        (base(messages={}), "messages", "expected a non-empty list of messages, got an object"),
        (base(messages=["hi"]), "messages[0]", "expected a message object, got a string"),
        (base(messages=[{"content": "x"}]), "messages[0].role", "required"),
        (base(messages=[{"role": "user"}]), "messages[0].content", "required"),
        (base(messages=[{"role": "system", "content": "only"}]), "messages", "at least one user"),
    ],
)
def test_required_fields(body: dict, param: str, fragment: str) -> None:
    err = error_of(body)
    assert err.param == param
    assert err.message.startswith(param + ": ")
    assert fragment in err.message


@pytest.mark.parametrize(
    "raw, fragment",
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"{", "not valid JSON"),
        (b'{"model": }', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"model": "\xff"}', "not valid JSON"),  # invalid UTF-8 inside a string
        (b"[]", "must be a JSON object, got a list"),
        (b"42", "must be a JSON object, got an integer"),
        (b'"x"', "must be a JSON object, got a string"),
        (b"null", "must be a JSON object, got null"),
        (b"[" * 100_000 + b"]" * 100_000, ""),
    ],
)
def test_body_level_errors(raw: bytes, fragment: str) -> None:
    err = error_of(raw)
    assert fragment in err.message
    assert err.param is None


def test_deeply_nested_tool_input_is_a_clean_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    raw = (
        b'{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use",'
        b'"id":"t","name":"n","input":{"a":' + deep + b"}}]}]}"
    )
    err = error_of(raw)
    assert "nested too deeply" in err.message


def test_unknown_top_level_fields_are_ignored_and_never_forwarded() -> None:
    req = parse(
        base(
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            service_tier="auto",
            container="cont_1",
            mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}],
            stop_sequences_typo=["x"],
            some_future_field={"a": 1},
        )
    )
    encoded = msgspec.json.encode(req)
    for name in (b"context_management", b"service_tier", b"container", b"mcp_servers", b"typo", b"future"):
        assert name not in encoded
    assert req.extra == {}


# ---------------------------------------------------------------------------------------------
# System prompt and roles
# ---------------------------------------------------------------------------------------------


def test_system_string() -> None:
    req = parse(base(system="Be brief."))
    assert req.messages[0] == c.Message(role="system", parts=[c.TextPart("Be brief.")])
    assert req.messages[1].role == "user"


def test_system_blocks_joined_and_billing_header_dropped() -> None:
    req = parse(
        base(
            system=[
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=ab12;"},
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": ""},
                {"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ]
        )
    )
    assert req.messages[0] == c.Message(
        role="system", parts=[c.TextPart("You are Claude Code.\n\nBe careful.")]
    )


@pytest.mark.parametrize("system", ["", [], [{"type": "text", "text": ""}], None])
def test_empty_system_gives_no_system_message(system: Any) -> None:
    req = parse(base(system=system))
    assert [m.role for m in req.messages] == ["user"]


@pytest.mark.parametrize(
    "system, param, fragment",
    [
        (5, "system", "expected a string or a list of text blocks, got an integer"),
        ([{"type": "image", "source": {}}], "system[0].type", "only text blocks"),
        (["x"], "system[0]", "expected a text block object, got a string"),
        ([{"type": "text"}], "system[0].text", "required"),
    ],
)
def test_system_errors(system: Any, param: str, fragment: str) -> None:
    err = error_of(base(system=system))
    assert err.param == param
    assert fragment in err.message


def test_inline_system_messages_kept_in_place() -> None:
    req = parse(
        base(
            system="top",
            messages=[
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"},
                {"role": "system", "content": "reminder"},
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "two"},
                    ],
                },
                {"role": "user", "content": "q2"},
            ],
        )
    )
    assert [(m.role, m.text()) for m in req.messages] == [
        ("system", "top"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("system", "reminder"),
        ("system", "one\n\ntwo"),
        ("user", "q2"),
    ]


def test_inline_system_between_tool_use_and_tool_result_moves_after_the_results() -> None:
    req = parse(
        base(
            messages=[
                {"role": "user", "content": "list files"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "call_1", "name": "ls", "input": {}}],
                },
                {"role": "system", "content": "mid-run reminder"},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ]
        )
    )
    assert [(m.role, m.text()) for m in req.messages] == [
        ("user", "list files"),
        ("assistant", ""),
        ("tool", "a.txt"),
        ("system", "mid-run reminder"),
        ("user", "thanks"),
    ]


def test_trailing_inline_system_after_tool_use_is_kept_at_the_end() -> None:
    req = parse(
        base(
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
                {"role": "system", "content": "late"},
            ]
        )
    )
    assert [m.role for m in req.messages] == ["user", "assistant", "system"]


def test_inline_system_billing_header_and_empty_dropped() -> None:
    req = parse(
        base(
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: x"}]},
                {"role": "system", "content": ""},
                {"role": "user", "content": "q"},
            ]
        )
    )
    assert [m.role for m in req.messages] == ["user"]


def test_inline_system_rejects_non_text_blocks() -> None:
    err = error_of(
        base(
            messages=[
                {"role": "system", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]},
                {"role": "user", "content": "q"},
            ]
        )
    )
    assert err.param == "messages[0].content[0]"
    assert "only hold text blocks" in err.message


@pytest.mark.parametrize("role", ["ctx", "msg"])
def test_claude_code_ctx_and_msg_roles_read_as_user(role: str) -> None:
    req = parse(base(messages=[{"role": role, "content": "context"}, {"role": "user", "content": "q"}]))
    assert [m.role for m in req.messages] == ["user", "user"]


@pytest.mark.parametrize("role", ["tool", "developer", "bot", "", "USER"])
def test_unknown_roles_are_rejected(role: str) -> None:
    err = error_of(base(messages=[{"role": "user", "content": "a"}, {"role": role, "content": "x"}]))
    assert err.param == "messages[1].role"
    assert repr(role) in err.message


def test_role_must_be_a_string() -> None:
    err = error_of(base(messages=[{"role": 1, "content": "x"}]))
    assert err.message == "messages[0].role: expected a string, got an integer"


# ---------------------------------------------------------------------------------------------
# Content blocks
# ---------------------------------------------------------------------------------------------


def test_content_errors_name_the_path() -> None:
    err = error_of(base(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": 42}]))
    assert err.param == "messages[2].content"
    assert err.message == "messages[2].content: expected a string or a list of content blocks, got an integer"


def test_text_blocks_keep_their_boundaries() -> None:
    req = parse(
        base(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                        {"type": "text", "text": "the question", "cache_control": {"type": "ephemeral"},
                         "citations": None},
                    ],
                }
            ]
        )
    )
    assert req.messages[0].parts == [
        c.TextPart("<system-reminder>ctx</system-reminder>"),
        c.TextPart("the question"),
    ]


def test_empty_string_content() -> None:
    req = parse(base(messages=[{"role": "user", "content": ""}]))
    assert req.messages == [c.Message(role="user", parts=[])]


def test_images() -> None:
    req = parse(
        base(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.org/cat.jpg"}},
                        {"type": "text", "text": "what are these?"},
                    ],
                }
            ]
        )
    )
    assert req.messages[0].parts == [
        c.ImagePart("data:image/png;base64,iVBOR"),
        c.ImagePart("https://example.org/cat.jpg"),
        c.TextPart("what are these?"),
    ]


@pytest.mark.parametrize(
    "source, param, fragment",
    [
        ({"type": "file", "file_id": "file_1"}, "messages[0].content[0].source.type", "Files API"),
        ({"type": "s3", "url": "s3://x"}, "messages[0].content[0].source.type", "'s3'"),
        ({"type": "base64", "data": "x"}, "messages[0].content[0].source.media_type", "required"),
        ({"type": "base64", "media_type": "image/png"}, "messages[0].content[0].source.data", "base64"),
        ({"type": "url"}, "messages[0].content[0].source.url", "URL"),
        ({"media_type": "image/png", "data": "x"}, "messages[0].content[0].source.type", "required"),
    ],
)
def test_image_errors(source: dict, param: str, fragment: str) -> None:
    err = error_of(base(messages=[{"role": "user", "content": [{"type": "image", "source": source}]}]))
    assert err.param == param
    assert fragment in err.message


def test_plain_text_document_becomes_text() -> None:
    req = parse(
        base(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "file body"},
                            "title": "notes.txt",
                            "citations": {"enabled": True},
                        },
                        {"type": "text", "text": "summarise"},
                    ],
                }
            ]
        )
    )
    assert req.messages[0].parts == [c.TextPart("file body"), c.TextPart("summarise")]


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "application/pdf", "data": "JVBER"},
        {"type": "url", "url": "https://example.org/a.pdf"},
        {"type": "content", "content": "x"},
        {"type": "file", "file_id": "f"},
    ],
)
def test_other_documents_are_a_clear_error(source: dict) -> None:
    err = error_of(base(messages=[{"role": "user", "content": [{"type": "document", "source": source}]}]))
    assert err.param == "messages[0].content[0].source.type"
    assert repr(source["type"]) in err.message
    assert "plain-text" in err.message


@pytest.mark.parametrize("block_type", ["search_result", "video", "audio", "tool_reference", "Text"])
def test_unknown_block_types_are_a_clear_error(block_type: str) -> None:
    err = error_of(
        base(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": block_type}]}])
    )
    assert err.param == "messages[0].content[1].type"
    assert err.message == f"messages[0].content[1].type: unsupported content block type '{block_type}'"


def test_block_without_type() -> None:
    err = error_of(base(messages=[{"role": "user", "content": [{"text": "a"}]}]))
    assert err.param == "messages[0].content[0].type"


def test_block_that_is_not_an_object() -> None:
    err = error_of(base(messages=[{"role": "user", "content": [5]}]))
    assert err.message == "messages[0].content[0]: expected a content block object, got an integer"


@pytest.mark.parametrize(
    "block_type",
    [
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "redacted_thinking",
    ],
)
def test_server_tool_and_redacted_blocks_are_dropped(block_type: str) -> None:
    req = parse(
        base(
            messages=[
                {"role": "user", "content": "search"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": block_type, "id": "srvtoolu_1", "name": "web_search", "data": "xx", "content": []},
                        {"type": "text", "text": "found it"},
                    ],
                },
            ]
        )
    )
    assert req.messages[1] == c.Message(role="assistant", parts=[c.TextPart("found it")])
    assert b"srvtoolu" not in msgspec.json.encode(req)


# ---------------------------------------------------------------------------------------------
# Tool use / tool result
# ---------------------------------------------------------------------------------------------


def test_tool_use_history_and_tool_results_before_user_text() -> None:
    req = parse(
        base(
            messages=[
                {"role": "user", "content": "weather in Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "call_b", "name": "weather",
                         "input": {"city": "Rome", "units": ["c"], "n": 1.5}, "cache_control": {"type": "ephemeral"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "(also: be brief)"},
                        {"type": "tool_result", "tool_use_id": "call_a", "content": "18C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "call_b",
                            "content": [{"type": "text", "text": "21C"}, {"type": "text", "text": " sunny"}],
                            "cache_control": {"type": "ephemeral"},
                        },
                    ],
                },
            ]
        )
    )
    user, assistant, tool_a, tool_b, extra = req.messages
    assert assistant.role == "assistant"
    assert assistant.parts == [c.TextPart("Checking.")]
    assert assistant.tool_calls == [
        c.ToolCall(id="call_a", name="weather", arguments='{"city":"Paris"}'),
        c.ToolCall(id="call_b", name="weather", arguments='{"city":"Rome","units":["c"],"n":1.5}'),
    ]
    assert json.loads(assistant.tool_calls[1].arguments) == {"city": "Rome", "units": ["c"], "n": 1.5}
    assert tool_a == c.Message(role="tool", parts=[c.TextPart("18C")], tool_call_id="call_a")
    assert tool_b == c.Message(
        role="tool", parts=[c.TextPart("21C"), c.TextPart(" sunny")], tool_call_id="call_b"
    )
    assert extra == c.Message(role="user", parts=[c.TextPart("(also: be brief)")])


def test_user_message_with_only_tool_results_gives_only_tool_messages() -> None:
    req = parse(
        base(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            ]
        )
    )
    assert [m.role for m in req.messages] == ["user", "assistant", "tool"]
    assert req.messages[1].tool_calls[0].arguments == "{}"
    assert req.messages[2] == c.Message(role="tool", parts=[], tool_call_id="t1")


@pytest.mark.parametrize(
    "content, parts",
    [
        ("boom", [c.TextPart("[tool error] boom")]),
        ([{"type": "text", "text": "boom"}, {"type": "text", "text": "more"}],
         [c.TextPart("[tool error] boom"), c.TextPart("more")]),
        (None, [c.TextPart("[tool error]")]),
        ("", [c.TextPart("[tool error]")]),
        ([{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
         [c.TextPart("[tool error]"), c.ImagePart("http://x/y.png")]),
    ],
)
def test_tool_result_is_error_prefix(content: Any, parts: list) -> None:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t", "is_error": True}
    if content is not None:
        block["content"] = content
    req = parse(base(messages=[{"role": "user", "content": [block]}]))
    assert req.messages == [c.Message(role="tool", parts=parts, tool_call_id="t")]


def test_tool_result_is_error_false_has_no_prefix() -> None:
    req = parse(base(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "ok", "is_error": False}]}]))
    assert req.messages[0].parts == [c.TextPart("ok")]


def test_tool_result_with_images_documents_and_tool_references() -> None:
    req = parse(
        base(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [
                                {"type": "text", "text": "screenshot:"},
                                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAA"}},
                                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "log"}},
                                {"type": "tool_reference", "tool_name": "Read"},
                            ],
                        }
                    ],
                }
            ]
        )
    )
    assert req.messages[0].parts == [
        c.TextPart("screenshot:"),
        c.ImagePart("data:image/jpeg;base64,AAA"),
        c.TextPart("log"),
        c.TextPart("Tool loaded: Read"),  # named to the model, never dropped without a trace
    ]


@pytest.mark.parametrize(
    "block, param",
    [
        ({"type": "tool_result", "content": "x"}, "messages[0].content[0].tool_use_id"),
        ({"type": "tool_result", "tool_use_id": "t", "content": 5}, "messages[0].content[0].content"),
        ({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "thinking", "thinking": "x"}]},
         "messages[0].content[0].content[0].type"),
        ({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}, "messages[0].content[0].is_error"),
        ({"type": "tool_use", "id": "t", "name": "n", "input": {}}, "messages[0].content[0].type"),
    ],
)
def test_tool_result_errors(block: dict, param: str) -> None:
    err = error_of(base(messages=[{"role": "user", "content": [block]}]))
    assert err.param == param


@pytest.mark.parametrize(
    "block, param",
    [
        ({"type": "tool_use", "name": "n", "input": {}}, "messages[1].content[0].id"),
        ({"type": "tool_use", "id": "t", "input": {}}, "messages[1].content[0].name"),
        ({"type": "tool_use", "id": "t", "name": "n"}, "messages[1].content[0].input"),
        ({"type": "tool_use", "id": "t", "name": "n", "input": [1]}, "messages[1].content[0].input"),
        ({"type": "tool_result", "tool_use_id": "t"}, "messages[1].content[0].type"),
        ({"type": "image", "source": {"type": "url", "url": "http://x"}}, "messages[1].content[0].type"),
        ({"type": "document", "source": {"type": "text", "data": "x"}}, "messages[1].content[0].type"),
    ],
)
def test_assistant_block_errors(block: dict, param: str) -> None:
    err = error_of(base(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": [block]}]))
    assert err.param == param


# ---------------------------------------------------------------------------------------------
# Thinking in history
# ---------------------------------------------------------------------------------------------


def _assistant_with(*blocks: dict) -> dict:
    return base(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": list(blocks)},
                          {"role": "user", "content": "next"}])


def test_our_signed_thinking_is_replayed_as_reasoning() -> None:
    thought = "Let me think about the user's question."
    req = parse(_assistant_with(
        {"type": "thinking", "thinking": thought, "signature": SIGNER.sign(thought)},
        {"type": "text", "text": "Answer."},
    ))
    assistant = req.messages[1]
    assert assistant.reasoning == thought
    assert assistant.parts == [c.TextPart("Answer.")]


def test_several_signed_thinking_blocks_are_joined() -> None:
    a, b = "first", "second"
    req = parse(_assistant_with(
        {"type": "thinking", "thinking": a, "signature": SIGNER.sign(a)},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        {"type": "thinking", "thinking": b, "signature": SIGNER.sign(b)},
    ))
    assert req.messages[1].reasoning == "first\n\nsecond"


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "",
        "EqQBCkgIARABGAIiQL...anthropic-signature",
        OTHER_SIGNER.sign("Secret plan."),
        SIGNER.sign("a different text"),
        "hlf1.ünïcödé",  # non-ASCII: hmac.compare_digest would raise TypeError
    ],
)
def test_foreign_or_forged_thinking_is_dropped_never_shown(signature: str | None) -> None:
    block: dict[str, Any] = {"type": "thinking", "thinking": "Secret plan."}
    if signature is not None:
        block["signature"] = signature
    req = parse(_assistant_with(block, {"type": "text", "text": "Visible."}))
    assistant = req.messages[1]
    assert assistant.reasoning is None
    assert assistant.parts == [c.TextPart("Visible.")]
    assert b"Secret plan" not in msgspec.json.encode(req)


def test_thinking_in_a_user_message_is_dropped() -> None:
    req = parse(base(messages=[{"role": "user", "content": [
        {"type": "thinking", "thinking": "x", "signature": SIGNER.sign("x")}, {"type": "text", "text": "q"}]}]))
    assert req.messages == [c.Message(role="user", parts=[c.TextPart("q")])]


def test_thinking_block_shape_errors() -> None:
    err = error_of(_assistant_with({"type": "thinking", "signature": "s"}))
    assert err.param == "messages[1].content[0].thinking"


# ---------------------------------------------------------------------------------------------
# Tools and tool_choice
# ---------------------------------------------------------------------------------------------

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_tools() -> None:
    req = parse(
        base(
            tools=[
                {"name": "weather", "description": "Get weather", "input_schema": WEATHER_SCHEMA,
                 "cache_control": {"type": "ephemeral"}, "strict": True, "defer_loading": False},
                {"name": "noop", "input_schema": {"type": "object"}},
                {"type": "custom", "name": "custom_one", "input_schema": {"type": "object"}},
            ]
        )
    )
    assert req.tools == [
        c.Tool(name="weather", description="Get weather", parameters=WEATHER_SCHEMA),
        c.Tool(name="noop", description=None, parameters={"type": "object"}),
        c.Tool(name="custom_one", description=None, parameters={"type": "object"}),
    ]


def test_server_tools_are_dropped() -> None:
    req = parse(
        base(
            tools=[
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "bash_20250124", "name": "bash"},
                {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                {"name": "weather", "input_schema": WEATHER_SCHEMA},
            ]
        )
    )
    assert [t.name for t in req.tools] == ["weather"]


@pytest.mark.parametrize(
    "tool, param",
    [
        ({"name": "x"}, "tools[0].input_schema"),
        ({"type": "custom", "name": "x"}, "tools[0].input_schema"),
        ({"input_schema": {}}, "tools[0].name"),
        ({"name": "", "input_schema": {}}, "tools[0].name"),
        ({"name": "x", "input_schema": "object"}, "tools[0].input_schema"),
        ("weather", "tools[0]"),
    ],
)
def test_tool_errors(tool: Any, param: str) -> None:
    err = error_of(base(tools=[tool]))
    assert err.param == param


@pytest.mark.parametrize(
    "choice, expected, parallel",
    [
        ({"type": "auto"}, c.ToolChoice(mode="auto"), None),
        ({"type": "any"}, c.ToolChoice(mode="required"), None),
        ({"type": "none"}, c.ToolChoice(mode="none"), None),
        ({"type": "tool", "name": "weather"}, c.ToolChoice(mode="named", name="weather"), None),
        ({"type": "auto", "disable_parallel_tool_use": True}, c.ToolChoice(mode="auto"), False),
        ({"type": "any", "disable_parallel_tool_use": False}, c.ToolChoice(mode="required"), None),
    ],
)
def test_tool_choice(choice: dict, expected: c.ToolChoice, parallel: bool | None) -> None:
    req = parse(base(tools=[{"name": "weather", "input_schema": WEATHER_SCHEMA}], tool_choice=choice))
    assert req.tool_choice == expected
    assert req.parallel_tool_calls is parallel


def test_tool_choice_without_tools_is_dropped() -> None:
    req = parse(base(tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert req.tool_choice is None and req.parallel_tool_calls is None
    req = parse(base(tools=[{"type": "web_search_20250305", "name": "web_search"}], tool_choice={"type": "any"}))
    assert req.tools == [] and req.tool_choice is None


@pytest.mark.parametrize(
    "choice, param",
    [
        ({"type": "tool"}, "tool_choice.name"),
        ({"type": "tool", "name": "nope"}, "tool_choice.name"),
        ({"type": "required"}, "tool_choice.type"),
        ({}, "tool_choice.type"),
        ("auto", "tool_choice"),
    ],
)
def test_tool_choice_errors(choice: Any, param: str) -> None:
    err = error_of(base(tools=[{"name": "weather", "input_schema": WEATHER_SCHEMA}], tool_choice=choice))
    assert err.param == param


# ---------------------------------------------------------------------------------------------
# Sampling, stop, metadata
# ---------------------------------------------------------------------------------------------


def test_sampling_only_when_sent() -> None:
    req = parse(base(temperature=0.6, top_p=0.95, top_k=40))
    assert (req.temperature, req.top_p, req.top_k) == (0.6, 0.95, 40)
    req = parse(base(temperature=1, top_p=None, top_k=None))
    assert req.temperature == 1.0 and req.top_p is None and req.top_k is None
    req = parse(base(temperature=0))
    assert req.temperature == 0.0


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("temperature", -0.1, ">= 0"),
        ("temperature", "hot", "expected a number, got a string"),
        ("top_p", 1.5, "between 0 and 1"),
        ("top_p", -1, "between 0 and 1"),
        ("top_k", -1, ">= 0"),
        ("top_k", 2.5, "expected an integer, got a number"),
    ],
)
def test_sampling_errors(field: str, value: Any, fragment: str) -> None:
    err = error_of(base(**{field: value}))
    assert err.param == field
    assert fragment in err.message


def test_stop_sequences() -> None:
    assert parse(base(stop_sequences=["\n\nHuman:", "END"])).stop == ["\n\nHuman:", "END"]
    assert parse(base(stop_sequences=[])).stop == []
    assert parse(base(stop_sequences=None)).stop == []
    err = error_of(base(stop_sequences=["a", ""]))
    assert err.param == "stop_sequences[1]"
    err = error_of(base(stop_sequences="END"))
    assert err.param == "stop_sequences"
    err = error_of(base(stop_sequences=[1]))
    assert err.param == "stop_sequences[0]"


def test_metadata_user_id() -> None:
    assert parse(base(metadata={"user_id": "user_42"})).user == "user_42"
    assert parse(base(metadata={})).user is None
    assert parse(base(metadata={"user_id": None, "other": 1})).user is None
    err = error_of(base(metadata={"user_id": 5}))
    assert err.param == "metadata.user_id"


# ---------------------------------------------------------------------------------------------
# Reasoning controls
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "thinking, output_config, enabled, effort",
    [
        ({"type": "enabled", "budget_tokens": 1024}, None, True, "low"),
        ({"type": "enabled", "budget_tokens": 4095}, None, True, "low"),
        ({"type": "enabled", "budget_tokens": 4096}, None, True, "medium"),
        ({"type": "enabled", "budget_tokens": 16383}, None, True, "medium"),
        ({"type": "enabled", "budget_tokens": 16384}, None, True, "high"),
        ({"type": "enabled", "budget_tokens": 31999}, None, True, "high"),
        ({"type": "enabled"}, None, True, None),
        ({"type": "enabled", "budget_tokens": "lots"}, None, True, None),
        ({"type": "enabled", "budget_tokens": True}, None, True, None),
        ({"type": "adaptive"}, None, True, None),
        ({"type": "adaptive"}, {"effort": "medium"}, True, "medium"),
        ({"type": "enabled", "budget_tokens": 1024}, {"effort": "high"}, True, "high"),
        ({"type": "disabled"}, None, False, None),
        ({"type": "disabled"}, {"effort": "high"}, False, None),
        (None, {"effort": "low"}, None, "low"),
        (None, {"effort": "max"}, None, "high"),
        (None, {"effort": "xhigh"}, None, "high"),
        (None, {"effort": "extreme"}, None, None),
        (None, {"effort": 3}, None, None),
        ({"type": "whatever"}, None, None, None),
        ("enabled", "high", None, None),
        ([1, 2], [3], None, None),
        ({"type": "between_tools"}, {}, None, None),
    ],
)
def test_reasoning_controls_never_error(thinking: Any, output_config: Any, enabled: Any, effort: Any) -> None:
    body = base()
    if thinking is not None:
        body["thinking"] = thinking
    if output_config is not None:
        body["output_config"] = output_config
    req = parse(body)
    assert req.reasoning_enabled is enabled
    assert req.reasoning_effort == effort


def test_structured_output_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    expected = {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}
    assert parse(base(output_config={"format": {"type": "json_schema", "schema": schema}})).extra == expected
    assert parse(base(output_format={"type": "json_schema", "schema": schema})).extra == expected
    err = error_of(base(output_config={"effort": "low", "format": {"type": "xml"}}))
    assert err.param == "output_config.format"
    err = error_of(base(output_config={"format": {"type": "json_schema"}}))
    assert err.param == "output_config.format.schema"


# ---------------------------------------------------------------------------------------------
# A realistic Claude Code 2.1.x request
# ---------------------------------------------------------------------------------------------


def _claude_code_tools() -> list[dict]:
    names = [
        "Task", "Bash", "Glob", "Grep", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
        "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell",
        "SlashCommand", "Skill", "AskUserQuestion", "mcp__github__search", "mcp__github__get_issue",
        "mcp__fs__list", "mcp__fs__stat",
    ]
    tools = []
    for name in names:
        tools.append(
            {
                "name": name,
                "description": f"{name} tool. Use it wisely.",
                "input_schema": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "an argument"}},
                    "required": ["arg"],
                    "additionalProperties": False,
                    "$schema": "http://json-schema.org/draft-07/schema#",
                },
            }
        )
    tools[-1]["cache_control"] = {"type": "ephemeral"}
    return tools


def claude_code_request() -> dict:
    thought = "The user wants the tests fixed. I should read the file first."
    return {
        "model": "reasoning",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.160.a1b; cc_entrypoint=cli; cch=9f3e1;"},
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
             "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>\nAs you answer, use this context: ...\n</system-reminder>"},
                    {"type": "text", "text": "fix the failing test in tests/test_x.py"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": thought, "signature": SIGNER.sign(thought)},
                    {"type": "text", "text": "I'll read the test first."},
                    {"type": "tool_use", "id": "chatcmpl-tool-abc123", "name": "Read",
                     "input": {"arg": "tests/test_x.py"}},
                ],
            },
            {"role": "system", "content": "<system-reminder>The TodoWrite tool hasn't been used recently.</system-reminder>"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "chatcmpl-tool-abc123",
                        "content": "File does not exist.",
                        "is_error": True,
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Claude's own thoughts", "signature": "EqMBCkYIBxgCKkD..."},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a..."},
                    {"type": "tool_use", "id": "call_2", "name": "Glob", "input": {"arg": "tests/**/*.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_2",
                     "content": [{"type": "text", "text": "tests/test_y.py"}]},
                    {"type": "text", "text": "it's test_y actually", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        "tools": _claude_code_tools(),
        "metadata": {"user_id": "user_2f1e_account_9a8b_session_77c6"},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    }


def test_realistic_claude_code_request() -> None:
    req = parse(claude_code_request())
    assert req.model == "reasoning"
    assert req.max_tokens == 32000
    assert req.stream is True
    assert req.temperature == 1.0
    assert req.user == "user_2f1e_account_9a8b_session_77c6"
    assert req.reasoning_enabled is True
    assert req.reasoning_effort == "medium"
    assert len(req.tools) == 22
    assert req.tools[0].parameters["required"] == ["arg"]
    assert req.tool_choice is None and req.parallel_tool_calls is None
    assert req.extra == {}

    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "system", "assistant", "tool", "user"]
    system, user1, a1, tool1, inline, a2, tool2, user2 = req.messages
    assert system.text() == (
        "You are Claude Code, Anthropic's official CLI for Claude.\n\n"
        "You are an interactive CLI tool that helps users with software engineering tasks."
    )
    assert len(user1.parts) == 2
    assert a1.reasoning == "The user wants the tests fixed. I should read the file first."
    assert a1.parts == [c.TextPart("I'll read the test first.")]
    assert a1.tool_calls == [c.ToolCall("chatcmpl-tool-abc123", "Read", '{"arg":"tests/test_x.py"}')]
    # the inline system message sat between tool_use and its result: moved after the result
    assert tool1 == c.Message(role="tool", parts=[c.TextPart("[tool error] File does not exist.")],
                              tool_call_id="chatcmpl-tool-abc123")
    assert inline.text().startswith("<system-reminder>The TodoWrite")
    # foreign thinking and redacted thinking dropped
    assert a2.reasoning is None and a2.parts == []
    assert a2.tool_calls == [c.ToolCall("call_2", "Glob", '{"arg":"tests/**/*.py"}')]
    assert tool2 == c.Message(role="tool", parts=[c.TextPart("tests/test_y.py")], tool_call_id="call_2")
    assert user2 == c.Message(role="user", parts=[c.TextPart("it's test_y actually")])

    encoded = msgspec.json.encode(req)
    for leaked in (b"cache_control", b"billing-header", b"context_management", b"Claude's own thoughts",
                   b"EmwKAhgB", b"ephemeral"):
        assert leaked not in encoded


def test_claude_code_request_as_serialised_by_the_official_sdk() -> None:
    """The bytes the anthropic SDK really sends for this request parse to the same Request."""
    import anthropic
    import httpx2 as httpx

    sent: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        return httpx.Response(200, json={
            "id": "msg_1", "type": "message", "role": "assistant", "model": "reasoning",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})

    client = anthropic.Anthropic(
        api_key="x", base_url="http://gateway.test", max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    body = claude_code_request()
    body.pop("stream")
    extra = {k: body.pop(k) for k in ("context_management", "output_config", "thinking", "temperature")}
    client.messages.create(**body, extra_body=extra, timeout=30)
    assert parse(sent[0]) == parse({**claude_code_request(), "stream": False})


# ---------------------------------------------------------------------------------------------
# Property: nothing but GatewayError ever escapes
# ---------------------------------------------------------------------------------------------

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
any_json = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


# A well-formed request generator; `mutated()` then damages 0-2 random places in it, so the fuzz
# reaches deep into the translation instead of stopping at the first top-level field.

text = st.text(max_size=8)
name = st.text(min_size=1, max_size=6)
plain_dict = st.dictionaries(st.text(max_size=4), json_leaf, max_size=3)


def image_block() -> st.SearchStrategy:
    return st.fixed_dictionaries({
        "type": st.just("image"),
        "source": st.one_of(
            st.fixed_dictionaries({"type": st.just("base64"), "media_type": st.just("image/png"), "data": name}),
            st.fixed_dictionaries({"type": st.just("url"), "url": name}),
        ),
    })


text_block = st.fixed_dictionaries({"type": st.just("text"), "text": text},
                                   optional={"cache_control": st.just({"type": "ephemeral"})})
document_block = st.fixed_dictionaries({
    "type": st.just("document"),
    "source": st.fixed_dictionaries({"type": st.just("text"), "media_type": st.just("text/plain"), "data": text}),
})
tool_result_block = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": name},
    optional={
        "content": text | st.lists(text_block | image_block() | document_block, max_size=3),
        "is_error": st.booleans(),
    },
)
tool_use_block = st.fixed_dictionaries({"type": st.just("tool_use"), "id": name, "name": name, "input": plain_dict})
other_block = st.sampled_from([  # mostly the dropped kinds, sometimes an unsupported one
    {"type": "redacted_thinking", "data": "x"},
    {"type": "redacted_thinking", "data": "y"},
    {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_fetch", "input": {"url": "u"}},
    {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "x", "server_name": "s", "input": {}},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    {"type": "search_result", "source": "s", "title": "t", "content": []},
    {"type": "bogus"},
])


@st.composite
def thinking_block(draw: st.DrawFn) -> dict:
    thought = draw(text)
    signature = draw(st.sampled_from(["ours", "forged", "none"]))
    block = {"type": "thinking", "thinking": thought}
    if signature == "ours":
        block["signature"] = SIGNER.sign(thought)
    elif signature == "forged":
        block["signature"] = draw(text)
    return block


user_content = text | st.lists(
    st.one_of(text_block, image_block(), document_block, tool_result_block, other_block), max_size=4)
assistant_content = text | st.lists(
    st.one_of(text_block, tool_use_block, thinking_block(), other_block), max_size=4)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "ctx", "msg"]), "content": user_content}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": assistant_content}),
    st.fixed_dictionaries({"role": st.just("system"), "content": text | st.lists(text_block, max_size=2)}),
)
tool = st.one_of(
    st.fixed_dictionaries({"name": name, "input_schema": st.just({"type": "object"})},
                          optional={"description": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search_20250305", "bash_20250124"]), "name": name}),
)

well_formed = st.fixed_dictionaries(
    {
        "model": name,
        "max_tokens": st.integers(min_value=1, max_value=100_000),
        "messages": st.lists(message, min_size=1, max_size=5),
    },
    optional={
        "system": text | st.lists(text_block, max_size=3),
        "stream": st.booleans(),
        "stop_sequences": st.lists(name, max_size=3),
        "temperature": st.floats(min_value=0, max_value=2),
        "top_p": st.floats(min_value=0, max_value=1),
        "top_k": st.integers(min_value=0, max_value=100),
        "metadata": st.fixed_dictionaries({"user_id": text}),
        "tools": st.lists(tool, max_size=3),
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "none"])},
            optional={"disable_parallel_tool_use": st.booleans()}),
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "adaptive", "disabled", "x"])},
            optional={"budget_tokens": st.integers(-5, 50_000)}),
        "output_config": st.fixed_dictionaries({}, optional={
            "effort": st.sampled_from(["low", "medium", "high", "max", "x"]),
            "format": st.fixed_dictionaries({"type": st.sampled_from(["json_schema", "x"])},
                                            optional={"schema": st.just({"type": "object"})})}),
        "context_management": any_json,
        "cache_control": any_json,
    },
)


def _slots(node: Any, out: list) -> list:
    """Every (container, key) pair in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((node, k))
            _slots(v, out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((node, i))
            _slots(v, out)
    return out


@st.composite
def requests(draw: st.DrawFn) -> dict:
    body = copy.deepcopy(draw(well_formed))  # st.just / sampled_from values are shared objects
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        slots = _slots(body, [])
        container, key = slots[draw(st.integers(0, len(slots) - 1))]
        if isinstance(container, dict) and draw(st.integers(0, 4)) == 0:
            del container[key]
        else:
            container[key] = draw(any_json)
    return body


def check_request_invariants(req: c.Request) -> None:
    assert req.model and req.max_tokens >= 1 and req.messages
    tool_names = {t.name for t in req.tools}
    if req.tool_choice is not None:
        assert req.tools
        if req.tool_choice.mode == "named":
            assert req.tool_choice.name in tool_names
    for m in req.messages:
        assert m.role in ("system", "user", "assistant", "tool")
        if m.role == "tool":
            assert m.tool_call_id is not None
        if m.role != "assistant":
            assert not m.tool_calls and m.reasoning is None
        for call in m.tool_calls:
            assert isinstance(json.loads(call.arguments), dict)
    msgspec.json.encode(req)


def _parse_or_gateway_error(raw: bytes) -> None:
    try:
        req = parse_request(raw, signer=SIGNER)
    except GatewayError as err:
        assert err.kind == "invalid_request" and err.status == 400
        assert isinstance(err.message, str) and err.message
        if err.param is not None:
            assert err.message.startswith(err.param + ": ")
        return
    check_request_invariants(req)


FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(raw: bytes) -> None:
    _parse_or_gateway_error(raw)


@FUZZ
@given(any_json)
def test_fuzz_random_json(value: Any) -> None:
    _parse_or_gateway_error(json.dumps(value).encode())


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_fuzz_request_shaped_json(body: dict) -> None:
    _parse_or_gateway_error(json.dumps(body).encode())


@FUZZ
@given(requests(), st.integers(min_value=0, max_value=10_000), st.binary(min_size=1, max_size=3))
def test_fuzz_corrupted_request_bytes(body: dict, where: int, junk: bytes) -> None:
    raw = json.dumps(body).encode()
    i = where % (len(raw) + 1)
    _parse_or_gateway_error(raw[:i] + junk + raw[i + len(junk):])
