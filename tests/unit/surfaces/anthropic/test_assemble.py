"""Canonical events -> non-streaming Anthropic Messages body (surfaces/anthropic/assemble.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.anthropic.request import parse_request
from homelab_frontend.surfaces.anthropic.assemble import (
    MessageAssembler,
    new_message_id,
    new_tool_use_id,
)
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"unit-test-secret")
FORBIDDEN = re.compile(rb'"(choices|finish_reason|object)"')


def assemble(*events: c.Event, model: str = "reasoning") -> dict[str, Any]:
    asm = MessageAssembler(message_id="msg_test", model=model, signer=SIGNER)
    for e in events:
        asm.feed(e)
    return asm.result()


def check_body(body: dict[str, Any]) -> None:
    """Shape rules every body must satisfy, and the official SDK's model as the oracle."""
    assert list(body) == ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"]
    assert body["type"] == "message" and body["role"] == "assistant"
    assert body["content"], "content is never an empty array"
    assert set(body["usage"]) == {"input_tokens", "output_tokens"}
    raw = msgspec.json.encode(body)
    assert not FORBIDDEN.search(raw)
    assert b"chatcmpl" not in raw or b"chatcmpl-tool" in raw  # only passed-through tool ids
    if None not in body["usage"].values():
        anthropic.types.Message.model_validate(body)


USAGE = c.Usage(input_tokens=12, output_tokens=34)


# ---------------------------------------------------------------------------------------------
# The 2.11 contract, criterion by criterion
# ---------------------------------------------------------------------------------------------


def test_body_shape_and_literals() -> None:
    body = assemble(c.TextDelta("Hello"), c.Finish("stop"), USAGE, model="qwen2.5:3b-instruct")
    check_body(body)
    assert body == {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello"}],
        "model": "qwen2.5:3b-instruct",
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 34},
    }


def test_model_echoes_the_client_name() -> None:
    body = assemble(c.TextDelta("x"), c.Finish("stop"), USAGE, model="reasoning")
    assert body["model"] == "reasoning"
    assert b"DeepSeek" not in msgspec.json.encode(body)


@pytest.mark.parametrize(
    "reason, stop_reason",
    [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"),
     ("content_filter", "refusal")],
)
def test_stop_reasons(reason: Any, stop_reason: str) -> None:
    body = assemble(c.TextDelta("x"), c.Finish(reason), USAGE)
    assert body["stop_reason"] == stop_reason
    assert "stop_sequence" in body and body["stop_sequence"] is None
    check_body(body)


def test_stop_sequence_reports_the_matched_string() -> None:
    body = assemble(c.TextDelta("one two"), c.Finish("stop_sequence", stop_sequence="THREE"), USAGE)
    assert body["stop_reason"] == "stop_sequence"
    assert body["stop_sequence"] == "THREE"
    check_body(body)


def test_stop_sequence_is_null_unless_a_stop_string_fired() -> None:
    # a stray stop_sequence on another reason is not reported
    body = assemble(c.TextDelta("x"), c.Finish("stop", stop_sequence="X"), USAGE)
    assert body["stop_sequence"] is None


def test_usage_maps_exactly_two_fields() -> None:
    # seed 2.11: an upstream that reports no cached tokens gets input/output and nothing else
    body = assemble(c.TextDelta("x"), c.Finish("length"), c.Usage(input_tokens=7, output_tokens=4))
    assert body["usage"] == {"input_tokens": 7, "output_tokens": 4}
    assert b"cache" not in msgspec.json.encode(body)


def test_cached_prompt_tokens_become_cache_read_and_leave_input_tokens() -> None:
    # Anthropic: total prompt = input_tokens + cache_read_input_tokens (+ cache_creation, never
    # reported by an OpenAI-shaped upstream, so never sent)
    body = assemble(c.TextDelta("x"), c.Finish("length"),
                    c.Usage(input_tokens=7, output_tokens=4, cached_input_tokens=3))
    assert body["usage"] == {"input_tokens": 4, "output_tokens": 4, "cache_read_input_tokens": 3}
    assert b"cache_creation" not in msgspec.json.encode(body)
    # a nonsensical count (more cached than the prompt) is not turned into a negative input
    body = assemble(c.TextDelta("x"), c.Usage(input_tokens=2, output_tokens=1, cached_input_tokens=5))
    assert body["usage"] == {"input_tokens": 2, "output_tokens": 1}


def test_usage_last_reported_values_win() -> None:
    body = assemble(c.Usage(input_tokens=5), c.TextDelta("x"), c.Usage(output_tokens=1),
                    c.Usage(output_tokens=9), c.Finish("stop"))
    assert body["usage"] == {"input_tokens": 5, "output_tokens": 9}


def test_unreported_usage_is_null_not_an_invented_zero() -> None:
    body = assemble(c.TextDelta("x"), c.Finish("stop"))
    assert body["usage"] == {"input_tokens": None, "output_tokens": None}
    body = assemble(c.TextDelta("x"), c.Finish("stop"), c.Usage(input_tokens=3))
    assert body["usage"] == {"input_tokens": 3, "output_tokens": None}
    check_body(body)


def test_thinking_precedes_text() -> None:
    body = assemble(c.ReasoningDelta("Let me "), c.ReasoningDelta("think."), c.TextDelta("Hi "),
                    c.TextDelta("there"), c.Finish("stop"), USAGE)
    check_body(body)
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    thinking, text = body["content"]
    assert thinking == {"type": "thinking", "thinking": "Let me think.", "signature": SIGNER.sign("Let me think.")}
    assert text == {"type": "text", "text": "Hi there"}


@pytest.mark.parametrize("reasoning", [None, ""])
def test_no_thinking_block_without_reasoning(reasoning: str | None) -> None:
    events: list[c.Event] = [c.TextDelta("Hello")]
    if reasoning is not None:
        events.insert(0, c.ReasoningDelta(reasoning))
    body = assemble(*events, c.Finish("stop"), USAGE)
    assert body["content"] == [{"type": "text", "text": "Hello"}]


def test_reasoning_without_text_returns_the_thinking_block_alone() -> None:
    body = assemble(c.ReasoningDelta("Only thoughts."), c.TextDelta(""), c.Finish("length"), USAGE)
    check_body(body)
    assert body["content"] == [
        {"type": "thinking", "thinking": "Only thoughts.", "signature": SIGNER.sign("Only thoughts.")}
    ]
    assert body["stop_reason"] == "max_tokens"


def test_no_openai_names_anywhere() -> None:
    body = assemble(c.ReasoningDelta("r"), c.TextDelta("t"), c.ToolCallStart(0, "call_1", "f"),
                    c.ToolArgsDelta(0, '{"a": 1}'), c.Finish("tool_calls"), USAGE)
    raw = msgspec.json.encode(body)
    for word in (b"choices", b"finish_reason", b"object", b"prompt_tokens", b"completion_tokens",
                 b"chat.completion", b"message.content"):
        assert word not in raw


# ---------------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------------


def test_nothing_at_all_gives_one_empty_text_block() -> None:
    body = assemble(c.Finish("stop"), USAGE)
    assert body["content"] == [{"type": "text", "text": ""}]
    check_body(body)
    assert assemble()["content"] == [{"type": "text", "text": ""}]


def test_blank_text_next_to_other_blocks_is_dropped() -> None:
    body = assemble(c.ReasoningDelta("hmm"), c.TextDelta("\n\n"), c.Finish("stop"), USAGE)
    assert [b["type"] for b in body["content"]] == ["thinking"]
    body = assemble(c.ToolCallStart(0, "t1", "f"), c.TextDelta("\n"), c.ToolArgsDelta(0, "{}"),
                    c.Finish("tool_calls"), USAGE)
    assert [b["type"] for b in body["content"]] == ["tool_use"]


def test_blank_text_alone_is_kept() -> None:
    body = assemble(c.TextDelta("\n"), c.Finish("stop"), USAGE)
    assert body["content"] == [{"type": "text", "text": "\n"}]


def test_blank_reasoning_between_texts_merges_them() -> None:
    body = assemble(c.TextDelta("a"), c.ReasoningDelta(" "), c.TextDelta("b"), c.Finish("stop"), USAGE)
    assert body["content"] == [{"type": "text", "text": "ab"}]


def test_interleaved_blocks_keep_arrival_order() -> None:
    body = assemble(
        c.ReasoningDelta("plan"), c.TextDelta("Calling."), c.ToolCallStart(0, "call_a", "ls"),
        c.ToolArgsDelta(0, "{}"), c.ReasoningDelta("more"), c.TextDelta("Done."),
        c.Finish("stop"), USAGE,
    )
    check_body(body)
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "thinking", "text"]
    assert body["stop_reason"] == "tool_use"  # a "stop" with tool calls is a tool_use turn


def test_thinking_signature_round_trips_into_the_next_request() -> None:
    body = assemble(c.ReasoningDelta("step 1; "), c.ReasoningDelta("step 2"), c.TextDelta("42"),
                    c.Finish("stop"), USAGE)
    request = {
        "model": "reasoning",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": body["content"]},
            {"role": "user", "content": "and?"},
        ],
    }
    req = parse_request(json.dumps(request).encode(), signer=SIGNER)
    assert req.messages[1].reasoning == "step 1; step 2"
    assert req.messages[1].parts == [c.TextPart("42")]
    # another gateway instance (other secret) does not trust it
    req = parse_request(json.dumps(request).encode(), signer=ThinkingSigner(b"other"))
    assert req.messages[1].reasoning is None


# ---------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------


def test_tool_calls_with_split_arguments() -> None:
    body = assemble(
        c.ToolCallStart(0, "chatcmpl-tool-1", "weather"),
        c.ToolArgsDelta(0, '{"city": '),
        c.ToolCallStart(1, "call_2", "time"),
        c.ToolArgsDelta(0, '"Paris"}'),
        c.ToolArgsDelta(1, '{"tz": "CET"}'),
        c.Finish("tool_calls"),
        USAGE,
    )
    check_body(body)
    assert body["content"] == [
        {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "time", "input": {"tz": "CET"}},
    ]
    assert body["stop_reason"] == "tool_use"


def test_content_between_argument_fragments_does_not_lose_them() -> None:
    body = assemble(c.ToolCallStart(0, "t", "f"), c.ToolArgsDelta(0, '{"a"'), c.TextDelta("note"),
                    c.ToolArgsDelta(0, ": 1}"), c.Finish("tool_calls"), USAGE)
    assert body["content"] == [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
        {"type": "text", "text": "note"},
    ]


def test_missing_and_duplicate_tool_ids_are_generated() -> None:
    body = assemble(c.ToolCallStart(0, "", "f"), c.ToolCallStart(1, "same", "g"),
                    c.ToolCallStart(2, "same", "h"), c.Finish("tool_calls"), USAGE)
    ids = [b["id"] for b in body["content"]]
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", ids[0])
    assert ids[1] == "same"
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", ids[2])
    assert len(set(ids)) == 3


@pytest.mark.parametrize(
    "fragments, expected",
    [
        ([], {}),
        (["  "], {}),
        (["null"], {}),
        (["{}"], {}),
        (['{"path": "a.py", "n": [1, 2]}'], {"path": "a.py", "n": [1, 2]}),
        (['{"path": "a.p'], {"_raw_arguments": '{"path": "a.p'}),  # truncated by max_tokens
        (["[1, 2]"], {"_raw_arguments": "[1, 2]"}),
        (['"just a string"'], {"_raw_arguments": '"just a string"'}),
        (["{'single': 'quotes'}"], {"_raw_arguments": "{'single': 'quotes'}"}),
        (["[" * 5000 + "]" * 5000], {"_raw_arguments": "[" * 5000 + "]" * 5000}),
    ],
)
def test_tool_input_parsing_and_fallback(fragments: list[str], expected: dict) -> None:
    events: list[c.Event] = [c.ToolCallStart(0, "t", "f")]
    events += [c.ToolArgsDelta(0, f) for f in fragments]
    body = assemble(*events, c.Finish("tool_calls"), USAGE)
    assert body["content"][0]["input"] == expected


def test_arguments_before_their_start_are_kept_and_orphans_dropped() -> None:
    body = assemble(c.ToolArgsDelta(0, '{"a":'), c.ToolCallStart(0, "t", "f"), c.ToolArgsDelta(0, "1}"),
                    c.ToolArgsDelta(7, '{"never": "started"}'), c.Finish("tool_calls"), USAGE)
    assert body["content"] == [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]


def test_repeated_start_fills_missing_fields_only() -> None:
    body = assemble(c.ToolCallStart(0, "t", ""), c.ToolCallStart(0, "other", "f"),
                    c.ToolArgsDelta(0, "{}"), c.Finish("tool_calls"), USAGE)
    assert body["content"] == [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]


def test_no_finish_event() -> None:
    assert assemble(c.TextDelta("x"), USAGE)["stop_reason"] == "end_turn"
    assert assemble(c.ToolCallStart(0, "t", "f"), USAGE)["stop_reason"] == "tool_use"


def test_length_with_a_truncated_tool_call_stays_max_tokens() -> None:
    body = assemble(c.ToolCallStart(0, "t", "f"), c.ToolArgsDelta(0, '{"a'), c.Finish("length"), USAGE)
    assert body["stop_reason"] == "max_tokens"


# ---------------------------------------------------------------------------------------------
# Errors and ids
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, gw_kind, status",
    [("api_error", "upstream_error", 502), ("timeout_error", "timeout", 504),
     ("overloaded_error", "upstream_error", 503)],
)
def test_upstream_error_raises(kind: Any, gw_kind: str, status: int) -> None:
    asm = MessageAssembler(message_id="msg_x", model="m", signer=SIGNER)
    asm.feed(c.TextDelta("partial"))
    asm.feed(c.UpstreamError("upstream closed the connection", kind=kind))
    asm.feed(c.Finish("stop"))
    with pytest.raises(GatewayError) as info:
        asm.result()
    assert info.value.kind == gw_kind
    assert info.value.status == status
    assert info.value.message == "upstream closed the connection"


def test_result_is_repeatable() -> None:
    asm = MessageAssembler(message_id="msg_x", model="m", signer=SIGNER)
    for e in (c.ReasoningDelta("r"), c.TextDelta("t"), c.Finish("stop"), USAGE):
        asm.feed(e)
    assert asm.result() == asm.result()


def test_ids() -> None:
    ids = {new_message_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"msg_[A-Za-z0-9]{24}", i) for i in ids)
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", new_tool_use_id())


def test_the_official_sdk_reads_the_body() -> None:
    """End to end through the anthropic client: it parses our body into typed blocks."""
    import httpx2 as httpx

    body = assemble(c.ReasoningDelta("why"), c.TextDelta("because"), c.ToolCallStart(0, "call_9", "Read"),
                    c.ToolArgsDelta(0, '{"file_path": "/a"}'), c.Finish("tool_calls"), USAGE)
    client = anthropic.Anthropic(
        api_key="x", base_url="http://gateway.test", max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(
            lambda request: httpx.Response(200, content=msgspec.json.encode(body),
                                           headers={"content-type": "application/json"}))),
    )
    msg = client.messages.create(model="reasoning", max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].signature == SIGNER.sign("why")
    assert msg.content[2].input == {"file_path": "/a"}
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    assert msg.usage.input_tokens == 12 and msg.usage.output_tokens == 34


# ---------------------------------------------------------------------------------------------
# Property: any event sequence gives a well-formed body (or the upstream error)
# ---------------------------------------------------------------------------------------------

words = st.text(alphabet="ab \n{}\":1", max_size=6)
events = st.lists(
    st.one_of(
        st.builds(c.ReasoningDelta, words),
        st.builds(c.TextDelta, words),
        st.builds(c.ToolCallStart, st.integers(0, 2), st.sampled_from(["", "call_1", "call_2"]),
                  st.sampled_from(["f", "g"])),
        st.builds(c.ToolArgsDelta, st.integers(0, 3), words),
        st.builds(c.Usage, st.none() | st.integers(0, 99), st.none() | st.integers(0, 99)),
        st.builds(c.Finish, st.sampled_from(["stop", "length", "tool_calls", "stop_sequence", "content_filter"]),
                  st.none() | st.just("STOP")),
    ),
    max_size=14,
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.booleans())
def test_fuzz_event_sequences(evs: list[c.Event], fail: bool) -> None:
    asm = MessageAssembler(message_id=new_message_id(), model="reasoning", signer=SIGNER)
    for e in evs:
        asm.feed(e)
    if fail:
        asm.feed(c.UpstreamError("boom"))
        with pytest.raises(GatewayError):
            asm.result()
        return
    body = asm.result()
    check_body(body)
    content = body["content"]
    kinds = [b["type"] for b in content]
    for a, b in zip(kinds, kinds[1:]):
        assert not (a == b and a in ("text", "thinking")), "neighbouring blocks of one kind merge"
    for block in content:
        if block["type"] == "thinking":
            assert block["thinking"] and SIGNER.verify(block["thinking"], block["signature"])
        if block["type"] == "tool_use":
            assert isinstance(block["input"], dict) and block["id"]
    ids = [b["id"] for b in content if b["type"] == "tool_use"]
    assert len(ids) == len(set(ids))
    if body["stop_reason"] == "stop_sequence":
        pass  # the string is whatever the Finish carried (may be null if the upstream said none)
    else:
        assert body["stop_sequence"] is None


def test_hidden_thinking_is_empty_and_its_sealed_signature_round_trips() -> None:
    asm = MessageAssembler(message_id="msg_test", model="reasoning", signer=SIGNER, hide_reasoning=True)
    for ev in (c.ReasoningDelta("step 1; "), c.ReasoningDelta("step 2"), c.TextDelta("42"), c.Finish("stop"), USAGE):
        asm.feed(ev)
    body = asm.result()
    check_body(body)
    thinking = body["content"][0]
    assert thinking["type"] == "thinking" and thinking["thinking"] == ""
    assert "step" not in json.dumps(body)
    request = {"model": "reasoning", "max_tokens": 10, "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": body["content"]},
        {"role": "user", "content": "and?"}]}
    assert parse_request(json.dumps(request).encode(), signer=SIGNER).messages[1].reasoning == "step 1; step 2"
    assert parse_request(json.dumps(request).encode(), signer=ThinkingSigner(b"other")).messages[1].reasoning is None
