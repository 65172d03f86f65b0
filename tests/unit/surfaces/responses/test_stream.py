"""ResponsesStreamEncoder: examples, then hypothesis properties with the openai SDK's own Responses
stream accumulator (`client.responses.stream(...).get_final_response()`) as the oracle."""

from __future__ import annotations

import json
import os

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from homelab_frontend.canonical import (
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.surfaces.responses.request import parse_request
from homelab_frontend.surfaces.responses.assemble import base_response
from homelab_frontend.surfaces.responses.sealed import ReasoningSealer
from support.responses_sse_grammar import check_stream, parse_frames
from homelab_frontend.surfaces.responses.stream import ResponsesStreamEncoder
from homelab_frontend.upstream.decode import ChunkDecoder
from tests.unit.surfaces.anthropic.test_stream import TOOL_JSON, upstream_streams

MODEL = "reasoning"
SEALER = ReasoningSealer(ThinkingSigner(b"test-secret"))


def examples(n: int) -> int:
    return int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1")))


def new_encoder(body: dict | None = None, **kw) -> ResponsesStreamEncoder:
    parsed = parse_request(json.dumps(body or {"model": MODEL, "input": "hi"}).encode(), sealer=SEALER)
    return ResponsesStreamEncoder(base=base_response("resp_test", parsed, None), names=parsed.names, **kw)


def encode(events, *, end="finish", **kw) -> tuple[bytes, ResponsesStreamEncoder]:
    enc = new_encoder(**kw)
    raw = b"".join(enc.feed(e) for e in events)
    raw += enc.finish() if end == "finish" else enc.fail("server_error", "boom")
    return raw, enc


_SDK: dict = {}


def sdk_final_response(raw: bytes):
    """Run `raw` through the official SDK's Responses stream helper; its final Response."""
    client = _SDK.get("client")
    if client is None:
        client = _SDK["client"] = openai.OpenAI(
            api_key="test", base_url="http://gateway.test/v1", max_retries=0,
            http_client=httpx2.Client(transport=httpx2.MockTransport(
                lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_SDK["raw"]))),
        )
    _SDK["raw"] = raw
    with client.responses.stream(model=MODEL, input="hi") as stream:
        for _ in stream:
            pass
        return stream.get_final_response()


def view(output) -> list[tuple]:
    out = []
    for item in output:
        item = item if isinstance(item, dict) else item.model_dump()
        if item["type"] == "reasoning":
            out.append(("reasoning", "".join(p["text"] for p in item["content"])))
        elif item["type"] == "message":
            out.append(("message", "".join(p["text"] for p in item["content"])))
        else:
            out.append(("function_call", item["name"], item["arguments"]))
    return out


# -- examples ---------------------------------------------------------------------------------


def test_reasoning_then_text_has_the_full_grammar():
    raw, enc = encode([Usage(10, 0), ReasoningDelta("think"), ReasoningDelta("ing"), TextDelta("Hel"),
                       TextDelta("lo"), Usage(10, 4), Finish("stop")])
    events = check_stream(raw, model=MODEL)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"] == {
        "input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 14}
    assert view(final["output"]) == [("reasoning", "thinking"), ("message", "Hello")]
    assert final["output"][0]["summary"] == [] and "encrypted_content" not in final["output"][0]
    assert final == enc.response()
    sdk = sdk_final_response(raw)
    assert sdk.output_text == "Hello" and view(sdk.output) == view(final["output"])


def test_function_call_is_mapped_back_to_its_namespace():
    body = {"model": MODEL, "input": "hi", "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "d",
         "tools": [{"type": "function", "name": "spawn_agent", "parameters": {}}]},
        {"type": "web_search"}]}
    enc = new_encoder(body)
    raw = b"".join(enc.feed(e) for e in [ToolCallStart(0, "chatcmpl-tool-1", "multi_agent_v1__spawn_agent"),
                                         ToolArgsDelta(0, '{"a":'), ToolArgsDelta(0, "1}"), Finish("tool_calls")])
    raw += enc.finish()
    events = check_stream(raw, model=MODEL)
    item = events[-1]["response"]["output"][0]
    assert item == {"id": item["id"], "type": "function_call", "call_id": "chatcmpl-tool-1", "name": "spawn_agent",
                    "arguments": '{"a":1}', "status": "completed", "namespace": "multi_agent_v1"}
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done[0]["arguments"] == '{"a":1}'
    assert sdk_final_response(raw).output[0].namespace == "multi_agent_v1"


def test_length_is_incomplete_max_output_tokens():
    raw, _ = encode([TextDelta("abc"), Finish("length")])
    final = check_stream(raw)[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert sdk_final_response(raw).status == "incomplete"


def test_upstream_error_mid_stream_is_response_failed_and_nothing_after():
    enc = new_encoder()
    raw = enc.feed(TextDelta("a")) + enc.feed(UpstreamError("boom", "overloaded_error"))
    raw += enc.feed(TextDelta("b")) + enc.finish()
    events = check_stream(raw)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "rate_limit_exceeded", "message": "boom"}
    with pytest.raises((openai.APIError, RuntimeError)):  # the SDK: no response.completed
        sdk_final_response(raw)


def test_fail_before_anything_still_starts_the_response():
    enc = new_encoder()
    raw = enc.fail("server_error", "no")
    assert [e["type"] for e in check_stream(raw)] == ["response.created", "response.in_progress", "response.failed"]


def test_usage_is_never_invented():
    raw, _ = encode([TextDelta("a"), Finish("stop")])
    assert check_stream(raw)[-1]["response"]["usage"] is None
    raw, _ = encode([Usage(7, 2, 3), TextDelta("a"), Finish("stop")])
    assert check_stream(raw)[-1]["response"]["usage"] == {
        "input_tokens": 7, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 9}


def test_usage_details_are_always_there_upstream_counted_or_zero():
    # openai-python's ResponseUsage requires both details: the upstream's cached count or 0, the
    # gateway's count of reasoning deltas (never more than the output)
    raw, _ = encode([ReasoningDelta("a"), ReasoningDelta("b"), ReasoningDelta("c"), TextDelta("x"), Usage(5, 4),
                     Finish("stop")])
    usage = check_stream(raw)[-1]["response"]["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 3}
    final = sdk_final_response(raw)
    assert final.usage.output_tokens_details.reasoning_tokens == 3 and final.usage.input_tokens_details.cached_tokens == 0
    raw, _ = encode([ReasoningDelta("a"), ReasoningDelta("b"), Usage(5, 1), Finish("length")])
    assert check_stream(raw)[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}


def test_a_requested_summary_carries_the_reasoning_text():
    body = {"model": MODEL, "input": "hi", "reasoning": {"effort": "high", "summary": "auto"}}
    parsed = parse_request(json.dumps(body).encode(), sealer=SEALER)
    assert parsed.reasoning_summary
    enc = new_encoder(body, summary=parsed.reasoning_summary)
    raw = b"".join(enc.feed(e) for e in [ReasoningDelta("plan "), ReasoningDelta("it"), TextDelta("ok"),
                                          Usage(3, 3), Finish("stop")]) + enc.finish()
    events = check_stream(raw)
    kinds = [e["type"] for e in events]
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_text.delta" not in kinds
    item = events[-1]["response"]["output"][0]
    assert item["summary"] == [{"type": "summary_text", "text": "plan it"}] and item["content"] == []
    final = sdk_final_response(raw)  # the openai SDK's accumulator builds the same summary
    assert final.output[0].summary[0].text == "plan it" and final.output_text == "ok"


def test_encrypted_reasoning_opens_only_here():
    raw, _ = encode([ReasoningDelta("secret plan"), TextDelta("ok"), Finish("stop")], sealer=SEALER)
    item = check_stream(raw)[-1]["response"]["output"][0]
    blob = item["encrypted_content"]
    assert "secret" not in blob and SEALER.open(blob) == "secret plan"
    assert ReasoningSealer(ThinkingSigner(b"other")).open(blob) is None
    tampered = blob[:-2] + ("A" if blob[-2] != "A" else "B") + blob[-1]
    assert SEALER.open(tampered) is None
    for junk in (None, 1, "", "hlfr1.", "hlfr1.!!!", "x" * 100):
        assert SEALER.open(junk) is None


def test_whitespace_vllm_streams_before_a_calls_last_arguments_does_not_lose_them():
    # vllm PR #45287; the chunk decoder holds the "\n" (tests/unit/upstream/test_decode.py)
    dec = ChunkDecoder()
    chunks = [
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\\"a\\""}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"\\n"}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    ]
    raw, _ = encode([ev for ch in chunks for ev in dec.feed(ch)])
    final = check_stream(raw)[-1]["response"]
    assert view(final["output"]) == [("function_call", "f", '{"a":1}')]


def test_every_feed_returns_whole_frames():
    enc = new_encoder()
    for ev in [TextDelta("a"), ReasoningDelta("b"), ToolCallStart(0, "", "f"), ToolArgsDelta(0, "{}"), Finish("stop")]:
        out = enc.feed(ev)
        assert out == b"" or out.endswith(b"\n\n")
        parse_frames(out)


# -- properties -------------------------------------------------------------------------------

short_text = st.text(st.sampled_from("ab \n\t\"\\é😀"), max_size=5)


@st.composite
def event_sequences(draw):
    events, tools = [], []
    for _ in range(draw(st.integers(0, 22))):
        kind = draw(st.sampled_from(["reason", "text", "text", "ws", "tool", "args", "args", "usage", "finish", "error"]))
        if kind == "reason":
            events.append(ReasoningDelta(draw(short_text)))
        elif kind == "text":
            events.append(TextDelta(draw(short_text)))
        elif kind == "ws":
            events.append(TextDelta(draw(st.sampled_from(["\n", " ", ""]))))
        elif kind == "tool":
            idx = len(tools)
            tools.append([idx, draw(st.sampled_from(TOOL_JSON))])
            events.append(ToolCallStart(idx, draw(st.sampled_from(["", "call_1", "bad id", "call_1"])), "f"))
        elif kind == "args" and tools:
            t = tools[draw(st.integers(0, len(tools) - 1))] if draw(st.booleans()) else tools[-1]
            k = draw(st.integers(0, len(t[1])))
            events.append(ToolArgsDelta(t[0], t[1][:k]))
            t[1] = t[1][k:]
        elif kind == "usage":
            events.append(Usage(draw(st.none() | st.integers(1, 99)), draw(st.none() | st.integers(0, 50))))
        elif kind == "finish":
            events.append(Finish(draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))))
        elif kind == "error" and draw(st.integers(0, 3)) == 0:
            events.append(UpstreamError("boom"))
    return events, draw(st.sampled_from(["finish", "finish", "fail"]))


def reference(events) -> tuple[list[tuple], bool]:
    """An independent model of the transition table: the items a stream must end with."""
    items: list[list] = []
    cur = None  # ("reasoning"|"message"|"call", canonical index)
    for e in events:
        if isinstance(e, UpstreamError):
            return [tuple(i) for i in items if i[-1]], True
        if isinstance(e, ReasoningDelta) and e.text:
            if cur is None or cur[0] != "reasoning":
                if cur is not None:
                    items[-1].append(True)
                items.append(["reasoning", ""])
                cur = ("reasoning", None)
            items[-1][1] += e.text
        elif isinstance(e, TextDelta) and e.text:
            if cur is None or cur[0] != "message":
                if cur is not None:
                    items[-1].append(True)
                items.append(["message", ""])
                cur = ("message", None)
            items[-1][1] += e.text
        elif isinstance(e, ToolCallStart):
            if cur is not None:
                items[-1].append(True)
            items.append(["function_call", e.name, ""])
            cur = ("call", e.index)
        elif isinstance(e, ToolArgsDelta) and e.fragment and cur is not None and cur == ("call", e.index):
            items[-1][2] += e.fragment
    if cur is not None:
        items[-1].append(True)
    out = []
    for i in items:
        i = i[:-1]
        if i[0] == "function_call" and not i[2]:
            i[2] = "{}"
        out.append(tuple(i))
    return out, False


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sequences())
def test_property_arbitrary_event_sequences(seq):
    events, end = seq
    raw, enc = encode(events, end=end)
    parsed = check_stream(raw, model=MODEL)
    want, failed = reference(events)
    final = parsed[-1]["response"]
    if failed or end == "fail":
        assert parsed[-1]["type"] == "response.failed"
        with pytest.raises((openai.APIError, RuntimeError)):  # the SDK: no response.completed
            sdk_final_response(raw)
        return
    want_items = want
    assert view(final["output"]) == want_items
    assert final == enc.response()
    sdk = sdk_final_response(raw)
    assert view(sdk.output) == want_items
    ids = [i["call_id"] for i in final["output"] if i["type"] == "function_call"]
    assert len(ids) == len(set(ids))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(upstream_streams())
def test_property_upstream_chunks_through_decoder_and_encoder(stream):
    chunks, exp = stream
    dec, enc = ChunkDecoder(), new_encoder()
    raw = b""
    for p in chunks:
        for ev in dec.feed(p):
            raw += enc.feed(ev)
    assert dec.done
    raw += enc.finish()
    final = check_stream(raw, model=MODEL)[-1]["response"]
    sdk = sdk_final_response(raw)
    reasoning = "".join(p.text for i in sdk.output if i.type == "reasoning" for p in i.content)
    assert reasoning == exp["reasoning"]
    assert sdk.output_text == exp["content"]
    kinds = [i.type for i in sdk.output]
    assert kinds == (["reasoning"] if exp["reasoning"] else []) + (["message"] if exp["content"] else []) + ["function_call"] * len(exp["tools"])
    assert [(i.name, json.loads(i.arguments)) for i in sdk.output if i.type == "function_call"] == exp["tools"]
    assert [i.call_id for i in sdk.output if i.type == "function_call"] == exp["tool_ids"]
    assert sdk.status == ("incomplete" if exp["stop_reason"] == "max_tokens" else "completed")
    if exp["prompt"]:
        assert sdk.usage.input_tokens == exp["prompt"]
    assert sdk.model_dump()["output"] == final["output"] or view(sdk.output) == view(final["output"])


def _with_usage_details(doc):
    """The SDK's types require usage details that the gateway reports only when the upstream
    did (never invented): filled in a copy, so everything else is validated strictly."""
    doc = json.loads(json.dumps(doc))
    resp = doc.get("response", doc)
    u = resp.get("usage")
    if u is not None:
        u.setdefault("input_tokens_details", {"cached_tokens": 0})
        u["input_tokens_details"].setdefault("cache_write_tokens", 0)
        u.setdefault("output_tokens_details", {"reasoning_tokens": 0})
    return doc


@pytest.mark.parametrize("end", ["finish", "fail"])
def test_every_event_and_the_response_validate_against_the_sdk_types(end):
    import pydantic
    from openai.types.responses import Response, ResponseStreamEvent

    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    events = [Usage(10, 0, 2), ReasoningDelta("r"), TextDelta("t"), ToolCallStart(0, "c", "f"),
              ToolArgsDelta(0, "{}"), Usage(10, 5, 2), Finish("length")]
    raw, enc = encode(events, end=end, sealer=SEALER)
    for ev in parse_frames(raw):
        adapter.validate_python(_with_usage_details(ev))  # raises on any other deviation
    Response.model_validate(_with_usage_details(enc.response()))
