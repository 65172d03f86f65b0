"""AnthropicStreamEncoder: the seed's example sequences, then hypothesis properties.

Oracles: `check_stream` (our strict grammar checker), the Anthropic SDK's pydantic models
(every frame validated), and the SDK's real streaming client (`client.messages.stream(...)` over
an in-memory transport: its SSE decoder + MessageStream accumulator assemble the message).
"""

from __future__ import annotations

import json
import os
import time

import anthropic
import httpx2
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jiter import from_json

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
from support.anthropic_sse_grammar import assemble, check_stream, parse_frames
from homelab_frontend.surfaces.anthropic.stream import AnthropicStreamEncoder
from homelab_frontend.upstream.decode import ChunkDecoder

SIGNER = ThinkingSigner(b"test-secret")
MODEL = "reasoning"
_EVENT_ADAPTER = pydantic.TypeAdapter(RawMessageStreamEvent)


def examples(n: int) -> int:
    """Example count; HLF_HYPOTHESIS_SCALE=10 runs a deeper search locally."""
    return int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1")))


# ---------------------------------------------------------------------------------------------
# Helpers and oracles
# ---------------------------------------------------------------------------------------------


def new_encoder(**kw) -> AnthropicStreamEncoder:
    kw.setdefault("message_id", "msg_test01")
    kw.setdefault("model", MODEL)
    kw.setdefault("signer", SIGNER)
    return AnthropicStreamEncoder(**kw)


def encode(events, *, end="finish", **kw) -> bytes:
    enc = new_encoder(**kw)
    out = b"".join(enc.feed(e) for e in events)
    if end == "finish":
        out += enc.finish()
    elif end is not None:
        out += enc.fail(*end)
    return out


def names(raw: bytes) -> list[str]:
    return [n for n, _ in parse_frames(raw)]


def validate_with_sdk_models(events: list[dict]) -> None:
    for ev in events:
        if ev["type"] in ("ping", "error"):
            continue
        _EVENT_ADAPTER.validate_python(ev)


_SDK_BOX: dict = {}


def _sdk_client() -> anthropic.Anthropic:
    client = _SDK_BOX.get("client")
    if client is None:

        def handler(request):
            return httpx2.Response(
                200, headers={"content-type": "text/event-stream"}, content=_SDK_BOX["raw"]
            )

        client = anthropic.Anthropic(
            api_key="test",
            base_url="http://gateway.test",
            http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
            max_retries=0,
        )
        _SDK_BOX["client"] = client
    return client


def sdk_final_message(raw: bytes):
    """Run `raw` through the official SDK's streaming client; returns its final Message."""
    client = _sdk_client()
    _SDK_BOX["raw"] = raw
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        for _ in stream:
            pass
        return stream.get_final_message()


def full_check(raw: bytes) -> tuple[list[dict], dict]:
    events = check_stream(raw, model=MODEL)
    validate_with_sdk_models(events)
    return events, assemble(events)


# ---------------------------------------------------------------------------------------------
# The seed's examples
# ---------------------------------------------------------------------------------------------


def test_reasoning_then_text():
    raw = encode(
        [
            Usage(9, 0),
            ReasoningDelta("Okay,"),
            ReasoningDelta(" greet."),
            TextDelta("\n\nHel"),
            TextDelta("lo!"),
            Finish("stop"),
            Usage(9, 5),
        ]
    )
    events, msg = full_check(raw)
    assert names(raw) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # signature_delta
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    assert events[2]["delta"] == {"type": "thinking_delta", "thinking": "Okay,"}
    assert events[4]["delta"]["type"] == "signature_delta"
    assert events[5] == {"type": "content_block_stop", "index": 0}
    assert events[6] == {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
    assert events[7]["delta"] == {"type": "text_delta", "text": "\n\nHel"}
    # the index-0 stop precedes the first line mentioning index 1
    lines = raw.decode().splitlines()
    first_idx1 = next(i for i, l in enumerate(lines) if '"index":1' in l)
    stop0 = next(i for i, l in enumerate(lines) if "content_block_stop" in l and '"index":0' in l)
    assert stop0 < first_idx1
    assert events[0]["message"]["usage"] == {"input_tokens": 9, "output_tokens": 0}
    assert events[0]["message"]["model"] == MODEL
    assert events[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5, "input_tokens": 9},
    }
    assert msg["content"][0]["thinking"] == "Okay, greet."
    assert SIGNER.verify("Okay, greet.", msg["content"][0]["signature"])
    m = sdk_final_message(raw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Okay, greet." and m.content[1].text == "\n\nHello!"
    assert SIGNER.verify("Okay, greet.", m.content[0].signature)
    assert m.stop_reason == "end_turn" and m.usage.output_tokens == 5 and m.usage.input_tokens == 9
    assert b"[DONE]" not in raw


def test_text_only_is_index_0_without_thinking():
    raw = encode([TextDelta("Hi"), TextDelta(" there"), Finish("length")])
    events, msg = full_check(raw)
    assert names(raw) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["index"] == 0 and events[1]["content_block"]["type"] == "text"
    assert msg["stop_reason"] == "max_tokens"
    assert sdk_final_message(raw).content[0].text == "Hi there"


def test_reasoning_only_closes_thinking_before_message_delta():
    raw = encode([ReasoningDelta("just thinking"), Finish("length")])
    events, msg = full_check(raw)
    assert names(raw)[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[-4]["delta"]["type"] == "signature_delta"
    assert [b["type"] for b in msg["content"]] == ["thinking"]
    m = sdk_final_message(raw)
    assert m.content[0].thinking == "just thinking" and m.stop_reason == "max_tokens"


def test_tool_use():
    raw = encode(
        [
            Usage(20, 1),
            TextDelta("Let me look."),
            ToolCallStart(0, "chatcmpl-tool-abc123", "get_weather"),
            ToolArgsDelta(0, '{"city": '),
            ToolArgsDelta(0, '"Paris"}'),
            Finish("tool_calls"),
            Usage(20, 12),
        ]
    )
    events, msg = full_check(raw)
    assert events[4] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "chatcmpl-tool-abc123", "name": "get_weather", "input": {}},
    }
    assert events[5]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    assert msg["content"][1]["input"] == {"city": "Paris"}
    m = sdk_final_message(raw)
    assert m.stop_reason == "tool_use"
    assert m.content[1].type == "tool_use" and m.content[1].input == {"city": "Paris"}
    assert m.content[1].id == "chatcmpl-tool-abc123"


def test_two_tools_and_generated_ids():
    raw = encode(
        [
            ToolCallStart(0, "", "a"),
            ToolArgsDelta(0, "{}"),
            ToolCallStart(1, "bad id!", "b"),
            Finish("tool_calls"),
        ]
    )
    _, msg = full_check(raw)
    ids = [b["id"] for b in msg["content"]]
    assert all(i.startswith("toolu_") and len(i) == 30 for i in ids) and ids[0] != ids[1]
    # the argument-less tool still gets one (empty) input_json_delta, as Anthropic sends
    assert msg["content"][1]["input"] == {} and msg["content"][1]["input_json"] == ""
    m = sdk_final_message(raw)
    assert [b.input for b in m.content] == [{}, {}]


def test_content_and_tool_in_one_chunk_and_finish_with_content_in_one_chunk():
    dec = ChunkDecoder()
    enc = new_encoder()
    raw = b""
    for p in [
        b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Sure.","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\\"x\\":"}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"\\n","tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"finish_reason":"tool_calls"}]}',
        b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}',
        b"[DONE]",
    ]:
        for ev in dec.feed(p):
            raw += enc.feed(ev)
    assert dec.done
    raw += enc.finish()
    _, msg = full_check(raw)
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use"]
    assert msg["content"][0]["text"] == "Sure."
    assert msg["content"][1]["input"] == {"x": 1}
    assert msg["stop_reason"] == "tool_use"
    assert sdk_final_message(raw).content[1].input == {"x": 1}

    # finish + content in the same chunk
    dec, enc = ChunkDecoder(), new_encoder()
    raw = b""
    for p in [
        b'{"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop","stop_reason":"END"}]}',
        b"[DONE]",
    ]:
        for ev in dec.feed(p):
            raw += enc.feed(ev)
    raw += enc.finish()
    _, msg = full_check(raw)
    assert msg["content"][0]["text"] == "Hello"
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
    m = sdk_final_message(raw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "END"


def test_usage_only_final_chunk_and_unknown_input_tokens():
    # Ollama: usage only at the very end; message_start has 0 (schema requires an int),
    # message_delta carries the real input_tokens, which the SDK takes
    raw = encode([TextDelta("Hi"), Finish("stop"), Usage(30, 2)])
    events, _ = full_check(raw)
    assert events[0]["message"]["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert events[-2]["usage"] == {"output_tokens": 2, "input_tokens": 30}
    m = sdk_final_message(raw)
    assert (m.usage.input_tokens, m.usage.output_tokens) == (30, 2)
    assert m.usage.cache_read_input_tokens is None and m.usage.cache_creation_input_tokens is None

    # an estimate from the caller is used until the real count is known
    raw = encode([TextDelta("Hi"), Usage(31, 2)], input_tokens=28)
    events, _ = full_check(raw)
    assert events[0]["message"]["usage"]["input_tokens"] == 28
    assert events[-2]["usage"]["input_tokens"] == 31


def test_a_function_for_input_tokens_is_asked_when_message_start_is_written():
    figure = {"n": None}
    enc = new_encoder(input_tokens=lambda: figure["n"])
    figure["n"] = 17  # a count that arrived after the encoder was made, before the first token
    raw = enc.feed(TextDelta("Hi")) + enc.feed(Usage(None, 1)) + enc.finish()
    events, _ = full_check(raw)
    assert events[0]["message"]["usage"]["input_tokens"] == 17
    enc = new_encoder(input_tokens=lambda: None)  # nothing known: 0, as without any figure
    events, _ = full_check(enc.feed(TextDelta("Hi")) + enc.finish())
    assert events[0]["message"]["usage"]["input_tokens"] == 0


def test_cached_tokens_are_subtracted_and_reported_never_invented():
    raw = encode([Usage(100, 0, 64), TextDelta("x"), Usage(100, 3, 64)])
    events, _ = full_check(raw)
    assert events[0]["message"]["usage"] == {"input_tokens": 36, "output_tokens": 0, "cache_read_input_tokens": 64}
    assert events[-2]["usage"] == {"output_tokens": 3, "input_tokens": 36, "cache_read_input_tokens": 64}
    for ev in events:
        assert "cache_creation_input_tokens" not in json.dumps(ev)
    m = sdk_final_message(raw)
    assert (m.usage.input_tokens, m.usage.cache_read_input_tokens) == (36, 64)


def test_error_mid_stream():
    enc = new_encoder()
    raw = enc.feed(TextDelta("partial"))
    raw += enc.feed(UpstreamError("upstream went away", "api_error"))
    assert enc.ended and enc.failed
    assert enc.feed(TextDelta("more")) == b"" and enc.finish() == b"" and enc.ping() == b""
    assert enc.fail("api_error", "again") == b""
    events, _ = full_check(raw)
    assert names(raw) == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "upstream went away"}}
    assert b"message_stop" not in raw
    with pytest.raises(anthropic.APIStatusError) as exc:
        sdk_final_message(raw)
    assert exc.value.body["error"]["message"] == "upstream went away"


def test_fail_before_anything_is_a_lone_error_frame():
    enc = new_encoder()
    raw = enc.fail("overloaded_error", "busy")
    assert raw == b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
    check_stream(raw)
    assert enc.started and enc.ended


def test_ping_before_start_emits_message_start_first_and_ping_later():
    enc = new_encoder(input_tokens=12)
    raw = enc.ping()
    assert names(raw) == ["message_start", "ping"]
    raw += enc.feed(Usage(40, 0))  # the real count arrives too late for message_start...
    raw += enc.feed(ReasoningDelta("t"))
    raw += enc.ping()
    raw += enc.feed(TextDelta("x"))
    raw += enc.finish()
    events, _ = full_check(raw)
    assert events[0]["message"]["usage"]["input_tokens"] == 12
    assert events[-2]["usage"]["input_tokens"] == 40  # ...and is given in message_delta
    assert names(raw).count("ping") == 2
    sdk_final_message(raw)


def test_empty_answer():
    raw = encode([])
    events, msg = full_check(raw)
    assert names(raw) == ["message_start", "message_delta", "message_stop"]
    assert msg["content"] == [] and msg["stop_reason"] == "end_turn"
    assert sdk_final_message(raw).content == []


def test_empty_deltas_never_open_blocks():
    raw = encode([ReasoningDelta(""), TextDelta(""), ToolArgsDelta(0, ""), Finish("stop")])
    assert names(raw) == ["message_start", "message_delta", "message_stop"]


@pytest.mark.parametrize(
    "finish,stop_reason,stop_sequence",
    [
        (Finish("stop"), "end_turn", None),
        (Finish("length"), "max_tokens", None),
        (Finish("tool_calls"), "tool_use", None),
        (Finish("stop_sequence", "###"), "stop_sequence", "###"),
        (Finish("content_filter"), "refusal", None),
        (None, "end_turn", None),
    ],
)
def test_stop_reasons(finish, stop_reason, stop_sequence):
    raw = encode([TextDelta("a")] + ([finish] if finish else []))
    events, _ = full_check(raw)
    assert events[-2]["delta"] == {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
    m = sdk_final_message(raw)
    assert (m.stop_reason, m.stop_sequence) == (stop_reason, stop_sequence)


def test_first_finish_wins():
    raw = encode([TextDelta("a"), Finish("stop_sequence", "X"), Finish("stop")])
    assert check_stream(raw)[-2]["delta"]["stop_reason"] == "stop_sequence"


def test_interleavings_open_new_blocks():
    raw = encode(
        [
            TextDelta("a"),
            ReasoningDelta("r1"),
            ToolCallStart(0, "call_x", "f"),
            ToolArgsDelta(0, "{}"),
            ReasoningDelta("r2"),
            TextDelta("b"),
            ToolCallStart(1, "call_y", "g"),
            TextDelta("c"),
        ]
    )
    _, msg = full_check(raw)
    assert [b["type"] for b in msg["content"]] == ["text", "thinking", "tool_use", "thinking", "text", "tool_use", "text"]
    for b in msg["content"]:
        if b["type"] == "thinking":
            assert SIGNER.verify(b["thinking"], b["signature"])
    m = sdk_final_message(raw)
    assert [b.type for b in m.content] == ["text", "thinking", "tool_use", "thinking", "text", "tool_use", "text"]


def test_whitespace_vllm_streams_before_a_calls_last_arguments_does_not_lose_them():
    # vllm PR #45287: the "\n" after </tool_call> comes as content before the call's last argument
    # bytes; the chunk decoder holds it (tests/unit/upstream/test_decode.py), so the tool block is
    # still open when they arrive
    dec, enc = ChunkDecoder(), new_encoder()
    chunks = [
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\\"a\\": "}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"\\n"}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"Done."}}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
        b"[DONE]",
    ]
    raw = b"".join(enc.feed(ev) for ch in chunks for ev in dec.feed(ch)) + enc.finish()
    _, msg = full_check(raw)
    assert msg["content"][0]["input"] == {"a": 1}
    assert msg["content"][1] == {"type": "text", "text": "\nDone."}
    assert enc.dropped_tool_args == 0


def test_arguments_for_a_closed_tool_are_dropped_and_counted():
    enc = new_encoder()
    raw = enc.feed(ToolCallStart(0, "call_1", "f"))
    raw += enc.feed(ToolCallStart(1, "call_2", "g"))
    raw += enc.feed(ToolArgsDelta(0, '{"late": true}'))
    raw += enc.feed(ToolArgsDelta(7, '{"never": true}'))
    raw += enc.feed(ToolArgsDelta(1, '{"b": 2}'))
    raw += enc.finish()
    _, msg = full_check(raw)
    assert enc.dropped_tool_args == 2
    assert [b["input"] for b in msg["content"]] == [{}, {"b": 2}]


def test_every_feed_returns_complete_frames_at_once():
    enc = new_encoder()
    for ev in [Usage(1, 0), ReasoningDelta("a"), TextDelta("b"), ToolCallStart(0, "c", "f"), ToolArgsDelta(0, "{}")]:
        out = enc.feed(ev)
        assert out.endswith(b"\n\n") and out.count(b"event: ") == out.count(b"\ndata: ")
    assert enc.feed(TextDelta("zz")).count(b"text_delta") == 1


def test_encoder_hot_path_cost():
    """Decode + encode of a typical vLLM content chunk; the target is < 25 us CPU per chunk."""
    payload = (
        b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
        b'"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}],'
        b'"usage":{"prompt_tokens":900,"total_tokens":1000,"completion_tokens":100}}'
    )
    dec, enc = ChunkDecoder(), new_encoder()
    for ev in dec.feed(payload):
        enc.feed(ev)
    n = 5000
    t = time.process_time()
    for _ in range(n):
        for ev in dec.feed(payload):
            enc.feed(ev)
    per_chunk = (time.process_time() - t) / n * 1e6
    print(f"decode+encode: {per_chunk:.2f} us per chunk")
    assert per_chunk < 100  # generous: shared CPUs; typically a few microseconds


# ---------------------------------------------------------------------------------------------
# Property: arbitrary event sequences
# ---------------------------------------------------------------------------------------------

PING = object()


def reference(events):
    """The documented semantics, written independently of the encoder: expected blocks etc."""
    blocks: list[dict] = []
    cur = None  # the open block dict
    finish = None
    usage = {"in": None, "out": None, "cached": None}
    failed = None
    for ev in events:
        if ev is PING:
            continue
        if isinstance(ev, UpstreamError):
            failed = ev
            break
        if isinstance(ev, Usage):
            for k, v in (("in", ev.input_tokens), ("out", ev.output_tokens), ("cached", ev.cached_input_tokens)):
                if v is not None:
                    usage[k] = v
        elif isinstance(ev, Finish):
            finish = finish or ev
        elif isinstance(ev, ReasoningDelta):
            if not ev.text:
                continue
            if cur is not None and cur["type"] == "thinking":
                cur["thinking"] += ev.text
            else:
                cur = {"type": "thinking", "thinking": ev.text}
                blocks.append(cur)
        elif isinstance(ev, TextDelta):
            if not ev.text:
                continue
            if cur is not None and cur["type"] == "text":
                cur["text"] += ev.text
            else:
                cur = {"type": "text", "text": ev.text}
                blocks.append(cur)
        elif isinstance(ev, ToolCallStart):
            cur = {"type": "tool_use", "index": ev.index, "id": ev.id, "name": ev.name, "args": ""}
            blocks.append(cur)
        elif isinstance(ev, ToolArgsDelta):
            if ev.fragment and cur is not None and cur["type"] == "tool_use" and cur["index"] == ev.index:
                cur["args"] += ev.fragment
    return blocks, finish, usage, failed


STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence", "content_filter": "refusal"}

short_text = st.text(st.sampled_from("ab \n\t\"\\é😀"), max_size=5)
TOOL_JSON = ['{"city": "Paris", "n": 3}', '{"q": [1, 2, {"deep": null}]}', "{}", '{"s": "a\\"b"}']


@st.composite
def event_sequences(draw):
    n = draw(st.integers(0, 22))
    events = []
    tools = []  # [index, remaining json]
    for _ in range(n):
        kind = draw(st.sampled_from(["reason", "text", "text", "ws", "tool", "args", "args", "usage", "finish", "ping", "error"]))
        if kind == "reason":
            events.append(ReasoningDelta(draw(short_text)))
        elif kind == "text":
            events.append(TextDelta(draw(short_text)))
        elif kind == "ws":
            events.append(TextDelta(draw(st.sampled_from(["\n", " ", "\n\n", ""]))))
        elif kind == "tool":
            idx = len(tools)
            tool_id = draw(st.sampled_from(["", "call_abc", "chatcmpl-tool-1f2e", "bad id", f"toolu_0{idx}"]))
            tools.append([idx, draw(st.sampled_from(TOOL_JSON))])
            events.append(ToolCallStart(idx, tool_id, draw(st.sampled_from(["get_weather", "f"]))))
        elif kind == "args":
            if tools:
                t = tools[draw(st.integers(0, len(tools) - 1))] if draw(st.booleans()) else tools[-1]
                k = draw(st.integers(0, len(t[1])))
                events.append(ToolArgsDelta(t[0], t[1][:k]))
                t[1] = t[1][k:]
            else:
                events.append(ToolArgsDelta(draw(st.integers(0, 3)), "{}"))
        elif kind == "usage":
            events.append(
                Usage(
                    draw(st.none() | st.integers(50, 100)),
                    draw(st.none() | st.integers(0, 50)),
                    draw(st.none() | st.integers(0, 50)),
                )
            )
        elif kind == "finish":
            reason = draw(st.sampled_from(list(STOP)))
            events.append(Finish(reason, "##" if reason == "stop_sequence" else None))
        elif kind == "ping":
            events.append(PING)
        elif kind == "error" and draw(st.integers(0, 3)) == 0:
            events.append(UpstreamError("boom", draw(st.sampled_from(["api_error", "overloaded_error", "timeout_error"]))))
    # finish all tools' JSON at the end so well-formed cases are common
    for t in tools:
        if t[1] and draw(st.booleans()):
            events.append(ToolArgsDelta(t[0], t[1]))
    end = draw(st.sampled_from(["finish", "finish", "fail"]))
    return events, end


def content_view(blocks):
    """Comparable view of blocks from the reference model, `assemble` or the SDK."""
    out = []
    for b in blocks:
        if b["type"] == "text":
            out.append(("text", b["text"]))
        elif b["type"] == "thinking":
            out.append(("thinking", b["thinking"]))
        else:
            out.append(("tool_use", b["name"], b.get("args", b.get("input_json"))))
    return out


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sequences(), st.integers(0, 2**31))
def test_property_arbitrary_sequences(seq, salt):
    events, end = seq
    enc = new_encoder(message_id=f"msg_{salt}")
    raw = b""
    fed_any = False
    for ev in events:
        out = enc.ping() if ev is PING else enc.feed(ev)
        fed_any = fed_any or bool(out)
        # unbuffered: whole frames only, emitted at once
        assert out == b"" or out.endswith(b"\n\n")
        raw += out
        # every prefix is a valid (incomplete) stream
        check_stream(raw, complete=False)
    raw += enc.finish() if end == "finish" else enc.fail("api_error", "ended badly")
    assert enc.ended

    exp_blocks, exp_finish, exp_usage, exp_failed = reference(events)
    stream_events = check_stream(raw, model=MODEL)
    validate_with_sdk_models(stream_events)
    msg = assemble(stream_events)
    failed = exp_failed is not None or end == "fail"

    if failed:
        assert stream_events[-1]["type"] == "error"
        assert all(e["type"] != "message_stop" for e in stream_events)
        if exp_failed is not None:
            assert stream_events[-1]["error"] == {"type": exp_failed.kind, "message": exp_failed.message}
        if len(stream_events) == 1:
            return  # failure before anything was sent
    else:
        assert stream_events[-1]["type"] == "message_stop"

    # content, in order, with tool arguments exactly as the reference model keeps them
    assert content_view(msg["content"]) == content_view(exp_blocks)
    seen_ids = set()
    for got, want in zip(msg["content"], exp_blocks):
        if got["type"] == "thinking" and "signature" in got and got["signature"]:
            assert SIGNER.verify(got["thinking"], got["signature"])
        if got["type"] == "tool_use":
            valid = want["id"] and all(c.isalnum() or c in "_-" for c in want["id"])
            if valid and want["id"] not in seen_ids:
                assert got["id"] == want["id"]  # passed through
            else:
                assert got["id"].startswith("toolu_")
            seen_ids.add(got["id"])
    ids = [b["id"] for b in msg["content"] if b["type"] == "tool_use"]
    assert len(set(ids)) == len(ids), "tool ids must be unique within a message"

    if failed:
        with pytest.raises(anthropic.APIStatusError):
            sdk_final_message(raw)
        return

    # stop reason and usage
    want_reason = STOP[exp_finish.reason] if exp_finish else "end_turn"
    assert msg["stop_reason"] == want_reason
    assert msg["stop_sequence"] == (exp_finish.stop_sequence if want_reason == "stop_sequence" else None)
    md = stream_events[-2]
    assert md["usage"]["output_tokens"] == (exp_usage["out"] or 0)
    if exp_usage["in"] is not None:
        want_in = exp_usage["in"] - (exp_usage["cached"] or 0) if (exp_usage["cached"] or 0) <= exp_usage["in"] else exp_usage["in"]
        assert md["usage"]["input_tokens"] == want_in
    else:
        assert "input_tokens" not in md["usage"]
    assert md["usage"].get("cache_read_input_tokens") == exp_usage["cached"]

    # the official SDK agrees (when every tool's argument text is JSON it can parse)
    parseable = True
    for b in exp_blocks:
        if b["type"] == "tool_use" and b["args"]:
            try:
                from_json(b["args"].encode(), partial_mode=True)
            except ValueError:
                parseable = False
    if not parseable:
        return
    m = sdk_final_message(raw)
    assert m.id == f"msg_{salt}" and m.model == MODEL and m.role == "assistant"
    assert m.stop_reason == want_reason
    assert m.usage.output_tokens == (exp_usage["out"] or 0)
    sdk_view = []
    for b in m.content:
        if b.type == "text":
            sdk_view.append(("text", b.text))
        elif b.type == "thinking":
            sdk_view.append(("thinking", b.thinking))
            assert SIGNER.verify(b.thinking, b.signature)
        else:
            sdk_view.append(("tool_use", b.name, b.input))
    want_view = [
        ("tool_use", b["name"], from_json(b["args"].encode(), partial_mode=True) if b["args"] else {})
        if b["type"] == "tool_use"
        else content_view([b])[0]
        for b in exp_blocks
    ]
    assert sdk_view == want_view


# ---------------------------------------------------------------------------------------------
# Property: upstream chunks (vLLM / Ollama / llama.cpp shapes) split anywhere -> decoder -> encoder
# ---------------------------------------------------------------------------------------------


def _cuts(draw, s: str, max_pieces: int = 6) -> list[str]:
    if not s:
        return []
    points = sorted(set(draw(st.lists(st.integers(1, max(1, len(s) - 1)), max_size=max_pieces - 1))))
    bounds = [0, *[p for p in points if 0 < p < len(s)], len(s)]
    return [s[i:j] for i, j in zip(bounds, bounds[1:])]


def _chunk(delta: dict | None = None, finish=None, usage=None, stop_reason=None, choices=True) -> bytes:
    obj: dict = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    if choices:
        ch: dict = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
        if stop_reason is not None or finish is not None:
            ch["stop_reason"] = stop_reason
        obj["choices"] = [ch]
    else:
        obj["choices"] = []
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj, ensure_ascii=bool(usage is None)).encode()


answer_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@st.composite
def upstream_streams(draw):
    flavor = draw(st.sampled_from(["vllm", "vllm-compat", "ollama", "llamacpp"]))
    reasoning = draw(answer_text) if flavor != "ollama" or draw(st.booleans()) else ""
    content = draw(answer_text)
    n_tools = draw(st.integers(0, 2))
    tools = [(f"call_{i}x", draw(st.sampled_from(["get_weather", "lookup"])), draw(st.sampled_from(TOOL_JSON))) for i in range(n_tools)]
    finish = "tool_calls" if tools else draw(st.sampled_from(["stop", "length", "stop-seq"]))
    continuous = flavor.startswith("vllm") and draw(st.booleans())
    prompt = draw(st.integers(1, 500))
    ws_after_tool = flavor.startswith("vllm") and bool(tools) and draw(st.booleans())

    produced = 0
    chunks: list[bytes] = []

    def usage_now():
        return {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced} if continuous else None

    def add(delta=None, **kw):
        nonlocal produced
        chunks.append(_chunk(delta, usage=usage_now(), **kw))
        produced += 1

    rkey = {"vllm": ["reasoning"], "vllm-compat": ["reasoning", "reasoning_content"], "ollama": ["reasoning"], "llamacpp": ["reasoning_content"]}[flavor]
    add({"role": "assistant", "content": "" if flavor != "llamacpp" else None})
    for piece in _cuts(draw, reasoning):
        add({k: piece for k in rkey})
        if draw(st.integers(0, 5)) == 0:
            add({"content": ""})  # empty deltas
    content_pieces = _cuts(draw, content)
    last_content = content_pieces.pop() if content_pieces and not tools and draw(st.booleans()) else None
    for piece in content_pieces:
        add({"content": piece, "tool_calls": []} if draw(st.integers(0, 4)) == 0 else {"content": piece})
    tail_args = None
    for i, (tid, name, args) in enumerate(tools):
        if flavor == "ollama":
            add({"role": "assistant", "content": "", "tool_calls": [{"id": tid, "index": i, "type": "function", "function": {"name": name, "arguments": args}}]})
            continue
        pieces = _cuts(draw, args)
        first = pieces.pop(0) if pieces and draw(st.booleans()) else ("" if flavor == "llamacpp" else None)
        fn = {"name": name} if first is None else {"name": name, "arguments": first}
        add({"tool_calls": [{"id": tid, "type": "function", "index": i, "function": fn}]})
        if i == len(tools) - 1 and len(pieces) >= 1 and ws_after_tool:
            tail_args = pieces.pop()
        for piece in pieces:
            add({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        if tail_args is not None:
            add({"content": "\n"})  # the "\n" after </tool_call>, before vLLM's argument fix-up
    # the finish chunk, maybe with the last content or the last tool's remaining arguments
    delta: dict = {}
    if last_content is not None:
        delta["content"] = last_content
    if tail_args is not None:
        delta["tool_calls"] = [{"index": len(tools) - 1, "function": {"arguments": tail_args}}]
    stop_reason = "END" if finish == "stop-seq" and flavor.startswith("vllm") else None
    fr = "stop" if finish == "stop-seq" else finish
    if flavor == "llamacpp":
        chunks.append(_chunk(delta, finish=fr, usage={"prompt_tokens": prompt, "completion_tokens": produced + 1, "total_tokens": 0}))
    else:
        add(delta, finish=fr, stop_reason=stop_reason)
        if flavor != "ollama" or draw(st.booleans()):
            chunks.append(_chunk(choices=False, usage={"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": 0}))
        elif not continuous:
            prompt = 0  # Ollama without include_usage: never reported, message_start's 0 stands
    chunks.append(b"[DONE]")
    expected = {
        "reasoning": reasoning,
        "content": content,
        "tools": [(name, json.loads(args)) for _, name, args in tools],
        "tool_ids": [tid for tid, _, _ in tools],
        "stop_reason": {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}.get(finish)
        or ("stop_sequence" if stop_reason else "end_turn"),
        "stop_sequence": stop_reason,
        "prompt": prompt,
    }
    return chunks, expected


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
    assert b"[DONE]" not in raw
    events = check_stream(raw, model=MODEL)
    validate_with_sdk_models(events)
    m = sdk_final_message(raw)
    thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
    text = "".join(b.text for b in m.content if b.type == "text")
    assert thinking == exp["reasoning"]
    assert text == exp["content"]
    # reasoning first, then text, then tools: at most one block of each of the first two kinds
    kinds = [b.type for b in m.content]
    assert kinds == (["thinking"] if exp["reasoning"] else []) + (["text"] if exp["content"] else []) + ["tool_use"] * len(exp["tools"])
    assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == exp["tools"]
    assert [b.id for b in m.content if b.type == "tool_use"] == exp["tool_ids"]
    assert m.stop_reason == exp["stop_reason"]
    assert m.stop_sequence == exp["stop_sequence"]
    assert m.usage.input_tokens == exp["prompt"]
    for b in m.content:
        if b.type == "thinking":
            assert SIGNER.verify(b.thinking, b.signature)


# ---------------------------------------------------------------------------------------------
# check_stream itself is strict: each broken stream below is rejected
# ---------------------------------------------------------------------------------------------


def _frame(obj: dict) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + json.dumps(obj).encode() + b"\n\n"


_START = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": MODEL, "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}
_TEXT0 = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
_TD0 = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}}
_STOP0 = {"type": "content_block_stop", "index": 0}
_MD = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 1}}
_MS = {"type": "message_stop"}
_GOOD = [_START, _TEXT0, _TD0, _STOP0, _MD, _MS]


def _raw(frames) -> bytes:
    return b"".join(_frame(f) for f in frames)


def test_check_stream_accepts_the_good_stream():
    assert check_stream(_raw(_GOOD), model=MODEL) == _GOOD


@pytest.mark.parametrize(
    "raw,why",
    [
        (_raw(_GOOD).replace(b"event: content_block_delta\n", b""), "bare data frame"),
        (_raw(_GOOD) + b"data: [DONE]\n\n", "[DONE] forwarded"),
        (_raw(_GOOD[:-1]), "no message_stop"),
        (_raw(_GOOD + [_MS]), "message_stop twice"),
        (_raw([_START, _START] + _GOOD[1:]), "message_start twice"),
        (_raw(_GOOD[1:]), "no message_start"),
        (_raw([{"type": "ping"}] + _GOOD), "ping before message_start"),
        (_raw([_START, _TEXT0, _TD0, {**_TEXT0, "index": 1}, _STOP0, _MD, _MS]), "overlapping blocks"),
        (_raw([_START, {**_TEXT0, "index": 1}, {**_TD0, "index": 1}, {**_STOP0, "index": 1}, _MD, _MS]), "index gap"),
        (_raw([_START, _TEXT0, {**_TD0, "delta": {"type": "thinking_delta", "thinking": "x"}}, _STOP0, _MD, _MS]), "delta type mismatch"),
        (_raw([_START, _TEXT0, {**_TD0, "delta": {"type": "text_delta", "text": ""}}, _STOP0, _MD, _MS]), "empty delta"),
        (_raw([_START, _TEXT0, _STOP0, _MD, _MS]), "block without delta"),
        (_raw([_START, _TEXT0, _TD0, _MD, _STOP0, _MS]), "message_delta with an open block"),
        (
            _raw([_START, {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "t"}}, _STOP0, _MD, _MS]),
            "thinking without signature",
        ),
        (_raw([_START, _TEXT0, _TD0, {"type": "error", "error": {"type": "api_error", "message": "x"}}, _MS]), "frame after error"),
        (_raw([_START, {"type": "error", "error": {"type": "internal_error", "message": "x"}}]), "unknown error type"),
        (_raw([_START] + _GOOD[1:4] + [{**_MD, "delta": {"stop_reason": "stop", "stop_sequence": None}}, _MS]), "OpenAI stop reason"),
        (_raw([_START] + _GOOD[1:4] + [{**_MD, "delta": {"stop_reason": "stop_sequence", "stop_sequence": None}}, _MS]), "stop_sequence without string"),
        (_raw([{**_START, "message": {**_START["message"], "usage": {"output_tokens": 0}}}] + _GOOD[1:]), "no input_tokens"),
        (_raw([{**_START, "message": {**_START["message"], "model": "other"}}] + _GOOD[1:]), "wrong model"),
        (_raw([{**_START, "message": {**_START["message"], "id": "chatcmpl-1"}}] + _GOOD[1:]), "chatcmpl id"),
        (_raw(_GOOD).replace(b'"type": "content_block_stop"', b'"type": "content_block_end"'), "type differs from event"),
        (_raw(_GOOD)[:-1], "truncated frame"),
        (_raw(_GOOD).replace(b"\n", b"\r\n"), "CRLF"),
    ],
)
def test_check_stream_rejects(raw, why):
    with pytest.raises(AssertionError):
        check_stream(raw, model=MODEL)


# -- thinking display "omitted" -----------------------------------------------------------------


def test_hidden_reasoning_streams_an_empty_thinking_block_whose_signature_restores_it():
    events = [ReasoningDelta("Let me "), ReasoningDelta("ponder."), TextDelta("Hi"), Finish("stop")]
    raw = encode(events, hide_reasoning=True)
    checked = check_stream(raw, model=MODEL)
    assert not [e for e in checked if e.get("delta", {}).get("type") == "thinking_delta"]
    msg = assemble(checked)
    thinking, text = msg["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == ""
    assert "ponder" not in raw.decode()  # the reasoning is nowhere on the wire in the clear
    assert SIGNER.unseal(thinking["signature"]) == "Let me ponder."
    assert text == {"type": "text", "text": "Hi"}
    final = sdk_final_message(raw)  # the official SDK accepts it as a thinking block
    assert final.content[0].type == "thinking" and final.content[0].thinking == ""
    # shown (the default), the same stream carries the text and a plain signature
    shown = assemble(check_stream(encode(events), model=MODEL))["content"][0]
    assert shown["thinking"] == "Let me ponder." and SIGNER.verify("Let me ponder.", shown["signature"])


def test_hidden_reasoning_blocks_each_seal_their_own_text():
    events = [ReasoningDelta("one"), TextDelta("a"), ReasoningDelta("two"), TextDelta("b"), Finish("stop")]
    blocks = assemble(check_stream(encode(events, hide_reasoning=True), model=MODEL))["content"]
    assert [SIGNER.unseal(b["signature"]) for b in blocks if b["type"] == "thinking"] == ["one", "two"]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sequences(), st.integers(0, 2**31))
def test_property_hidden_reasoning_keeps_the_grammar_and_seals_each_block(seq, salt):
    events, end = seq
    enc = new_encoder(message_id=f"msg_{salt}", hide_reasoning=True)
    raw = b""
    for ev in events:
        out = enc.ping() if ev is PING else enc.feed(ev)
        assert out == b"" or out.endswith(b"\n\n")
        raw += out
        check_stream(raw, complete=False)
    raw += enc.finish() if end == "finish" else enc.fail("api_error", "ended badly")
    stream_events = check_stream(raw, model=MODEL)
    validate_with_sdk_models(stream_events)
    assert not any(e.get("delta", {}).get("type") == "thinking_delta" for e in stream_events)
    exp_blocks, _, _, exp_failed = reference(events)
    if exp_failed is not None or end == "fail":
        return
    msg = assemble(stream_events)
    hidden = [("thinking", "") if b[0] == "thinking" else b for b in content_view(exp_blocks)]
    assert content_view(msg["content"]) == hidden
    for got, want in zip(msg["content"], exp_blocks):
        if got["type"] == "thinking":
            assert SIGNER.unseal(got["signature"]) == want["thinking"]
