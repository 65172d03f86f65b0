"""NdjsonEncoder and WholeAssembler: examples, then hypothesis over upstream chunk splits.

Oracles: the official `ollama` Python library, its own response types (`ChatResponse`,
`GenerateResponse`: every object validated) and its real client (`Client.chat(stream=True)`
over an in-memory httpx transport: its line reader and error handling), plus the grammar the
JavaScript library and Open WebUI rely on (`check_ndjson` below: one object a line, no blank
line, `done: true` exactly once and last, or an `error` object instead).
"""

from __future__ import annotations

import json
import os

import httpx
import ollama
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.ollama.assemble import AnswerFailed, WholeAssembler
from homelab_frontend.surfaces.ollama.stream import Durations, NdjsonEncoder, durations, wall_clock
from homelab_frontend.upstream.decode import ChunkDecoder
from support.upstream_chunks import TOOL_JSON, upstream_streams

STAMP = "2026-12-01T21:00:00.123456789Z"
T = Durations(total=9_000, load=1_000, prompt_eval=2_000, eval=6_000)


def examples(n: int) -> int:
    return int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1")))


def new(endpoint="chat", **kw) -> NdjsonEncoder:
    return NdjsonEncoder(model="reasoning:latest", endpoint=endpoint, clock=lambda: STAMP, **kw)


def encode(events, endpoint="chat", end="finish") -> bytes:
    enc = new(endpoint)
    out = b"".join(enc.feed(e) for e in events)
    if end == "finish":
        out += enc.finish(T)
    elif end is not None:
        out += enc.fail("api_error", end)
    return out


def check_ndjson(raw: bytes, endpoint="chat") -> list[dict]:
    """The stream's grammar; -> its objects, each validated by the library's own type."""
    assert raw.endswith(b"\n") and b"\n\n" not in raw and not raw.startswith(b"\n"), raw
    objs = [json.loads(line) for line in raw.split(b"\n")[:-1]]
    assert objs, "an empty stream"
    kind = ollama.ChatResponse if endpoint == "chat" else ollama.GenerateResponse
    for k, obj in enumerate(objs):
        last = k == len(objs) - 1
        if "error" in obj:
            assert last and set(obj) == {"error"} and obj["error"], objs
            continue
        kind(**obj)
        assert obj["model"] == "reasoning:latest" and obj["created_at"] == STAMP
        if endpoint == "chat":
            assert obj["message"]["role"] == "assistant" and isinstance(obj["message"]["content"], str)
        else:
            assert isinstance(obj["response"], str)
        assert obj["done"] is last, objs
        if last:
            assert obj["done_reason"] in ("stop", "length")
            for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration", "eval_count"):
                assert isinstance(obj[key], int) and not isinstance(obj[key], bool) and obj[key] >= 0
    return objs


def client_over(raw: bytes, status: int = 200) -> ollama.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=raw, headers={"content-type": "application/x-ndjson"})

    return ollama.Client(host="http://gateway.test", transport=httpx.MockTransport(handler))


def sdk_chat(raw: bytes) -> list[ollama.ChatResponse]:
    return list(client_over(raw).chat(model="reasoning", messages=[{"role": "user", "content": "hi"}], stream=True))


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------


def test_thinking_text_and_the_done_object():
    raw = encode([c.ReasoningDelta("Let me"), c.ReasoningDelta(" think."), c.TextDelta("Hello"),
                  c.TextDelta(" world"), c.Usage(12, 5), c.Finish("stop")])
    objs = check_ndjson(raw)
    parts = sdk_chat(raw)
    assert "".join(p.message.thinking or "" for p in parts) == "Let me think."
    assert "".join(p.message.content or "" for p in parts) == "Hello world"
    last = parts[-1]
    assert last.done and last.done_reason == "stop"
    assert (last.prompt_eval_count, last.eval_count) == (12, 5)
    assert (last.total_duration, last.load_duration, last.prompt_eval_duration, last.eval_duration) == (9000, 1000, 2000, 6000)
    assert all("thinking" not in o["message"] for o in objs[2:])  # thinking only where there is some


def test_tool_calls_go_out_whole_with_object_arguments_and_ids():
    raw = encode([c.TextDelta("Checking."), c.ToolCallStart(0, "call_up1", "get_weather"),
                  c.ToolArgsDelta(0, '{"ci'), c.ToolArgsDelta(0, 'ty": "Paris"}'),
                  c.ToolCallStart(1, "", "lookup"), c.Finish("tool_calls")])
    objs = check_ndjson(raw)
    calls = [tc for o in objs for tc in o["message"].get("tool_calls", [])]
    assert calls == [
        {"id": "call_up1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "call_1", "function": {"index": 1, "name": "lookup", "arguments": {}}},
    ]
    parts = sdk_chat(raw)
    got = [tc for p in parts for tc in (p.message.tool_calls or [])]
    assert [(tc.function.name, dict(tc.function.arguments)) for tc in got] == [("get_weather", {"city": "Paris"}), ("lookup", {})]
    assert parts[-1].done_reason == "stop"  # Ollama says stop after tool calls too


def test_length_is_done_reason_length():
    objs = check_ndjson(encode([c.TextDelta("a"), c.Finish("length")]))
    assert objs[-1]["done_reason"] == "length"


def test_stop_sequence_is_stop_and_the_gateways_own_count_without_usage():
    objs = check_ndjson(encode([c.TextDelta("a"), c.TextDelta("b"), c.Finish("stop_sequence", "END")]))
    assert objs[-1]["done_reason"] == "stop" and objs[-1]["eval_count"] == 2
    assert "prompt_eval_count" not in objs[-1]  # never invented


def test_mid_stream_failure_ends_with_an_error_object_and_no_done():
    raw = encode([c.TextDelta("par"), c.UpstreamError("the backend closed the connection mid-stream")], end=None)
    objs = check_ndjson(raw)
    assert objs[-1] == {"error": "the backend closed the connection mid-stream"}
    assert not any(o.get("done") for o in objs)
    with pytest.raises(ollama.ResponseError) as exc:
        sdk_chat(raw)
    assert "mid-stream" in str(exc.value)


def test_fail_after_an_inband_error_writes_nothing_more():
    enc = new()
    first = enc.feed(c.UpstreamError("boom"))
    assert first == b'{"error":"boom"}\n' and enc.ended
    assert enc.feed(c.TextDelta("x")) == b"" and enc.finish(T) == b"" and enc.fail("api_error", "again") == b""


def test_arguments_that_are_not_an_object_end_the_stream_with_an_error():
    raw = encode([c.ToolCallStart(0, "c1", "f"), c.ToolArgsDelta(0, '{"cut off'), c.Finish("length")])
    objs = check_ndjson(raw)
    assert "not a JSON object" in objs[-1]["error"] and "'f'" in objs[-1]["error"]
    enc = new()
    enc.feed(c.ToolCallStart(0, "c1", "f"))
    enc.feed(c.ToolArgsDelta(0, "[]"))
    assert b'"error"' in enc.finish(T) and enc.ended and enc.failed  # the handler records the failure
    ok = new()
    ok.feed(c.TextDelta("x"))
    ok.finish(T)
    assert ok.ended and not ok.failed


def test_empty_deltas_write_nothing_so_no_blank_line():
    enc = new()
    assert enc.feed(c.TextDelta("")) == b"" and enc.feed(c.ReasoningDelta("")) == b""
    assert enc.feed(c.Usage(1, 0)) == b"" and enc.feed(c.ToolCallStart(0, "x", "f")) == b""


def test_empty_answer_is_one_done_object():
    objs = check_ndjson(encode([c.Finish("stop")]))
    assert len(objs) == 1 and objs[0]["message"] == {"role": "assistant", "content": ""}


def test_generate_stream_has_response_and_thinking():
    raw = encode([c.ReasoningDelta("hm"), c.TextDelta("The sky"), c.TextDelta(" is blue."), c.Usage(3, 4), c.Finish("stop")],
                 endpoint="generate")
    objs = check_ndjson(raw, "generate")
    assert "".join(o["response"] for o in objs) == "The sky is blue."
    assert objs[0]["thinking"] == "hm"
    resp = list(client_over(raw).generate(model="reasoning", prompt="why", stream=True))
    assert "".join(r.response for r in resp) == "The sky is blue." and resp[-1].done


def test_whole_chat_answer():
    asm = WholeAssembler(model="reasoning:latest", clock=lambda: STAMP)
    for ev in [c.ReasoningDelta("r"), c.TextDelta("a"), c.TextDelta("b"), c.ToolCallStart(0, "", "f"),
               c.ToolArgsDelta(0, '{"x": 1}'), c.Usage(7, 3), c.Finish("tool_calls")]:
        asm.feed(ev)
    doc = asm.result(T)
    resp = ollama.ChatResponse(**doc)
    assert resp.message.content == "ab" and resp.message.thinking == "r" and resp.done
    assert doc["message"]["tool_calls"] == [{"id": "call_0", "function": {"index": 0, "name": "f", "arguments": {"x": 1}}}]
    assert (resp.prompt_eval_count, resp.eval_count, resp.total_duration) == (7, 3, 9000)


def test_whole_generate_answer_and_failure():
    asm = WholeAssembler(model="reasoning:latest", endpoint="generate", clock=lambda: STAMP)
    asm.feed(c.TextDelta("hi"))
    asm.feed(c.Finish("length"))
    doc = asm.result(T)
    assert ollama.GenerateResponse(**doc).response == "hi" and doc["done_reason"] == "length"
    asm = WholeAssembler(model="m")
    with pytest.raises(AnswerFailed):
        asm.feed(c.UpstreamError("boom"))
    asm = WholeAssembler(model="m")
    asm.feed(c.ToolCallStart(0, "", "f"))
    asm.feed(c.ToolArgsDelta(0, "[1]"))
    with pytest.raises(AnswerFailed):
        asm.result(T)


def test_durations_from_the_record():
    # 0.25 s for a slot, 0.125 s of it for the server to start, first token at 1 s
    d = durations(elapsed=2.0, queue_wait=0.25, load_wait=0.125, ttft=1.0)
    assert d == Durations(2_000_000_000, 125_000_000, 750_000_000, 1_000_000_000)
    d = durations(elapsed=1.0, queue_wait=None, load_wait=None, ttft=None)
    assert d.load == 0 and d.prompt_eval == 0 and d.eval == 1_000_000_000
    assert d.total == d.load + d.prompt_eval + d.eval
    # a whole answer (no first token): everything after the slot is eval, never 0
    d = durations(elapsed=1.0, queue_wait=0.25, load_wait=0.0, ttft=None)
    assert (d.load, d.prompt_eval, d.eval) == (0, 0, 750_000_000)
    # a first token the record dates before the slot (clock skew): never negative
    d = durations(elapsed=1.0, queue_wait=0.6, load_wait=0.9, ttft=0.5)
    assert min(d.load, d.prompt_eval, d.eval) >= 0 and d.load <= 600_000_000


def test_wall_clock_is_rfc3339_with_nanoseconds():
    s = wall_clock()
    assert len(s) == 30 and s[10] == "T" and s.endswith("Z") and s[19] == "."


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


@st.composite
def event_sequences(draw):
    events: list[c.Event] = []
    started = 0
    for _ in range(draw(st.integers(0, 16))):
        kind = draw(st.sampled_from(["reason", "text", "text", "tool", "args", "usage", "finish", "error"]))
        if kind == "reason":
            events.append(c.ReasoningDelta(draw(st.text(max_size=4))))
        elif kind == "text":
            events.append(c.TextDelta(draw(st.text(max_size=4))))
        elif kind == "tool":
            events.append(c.ToolCallStart(started, draw(st.sampled_from(["", "call_a"])), "f"))
            started += 1
        elif kind == "args":
            events.append(c.ToolArgsDelta(draw(st.integers(0, 2)), draw(st.sampled_from(["{}", "", '{"a": 1}', "{"]))))
        elif kind == "usage":
            events.append(c.Usage(draw(st.none() | st.integers(0, 9)), draw(st.none() | st.integers(0, 9))))
        elif kind == "finish":
            events.append(c.Finish(draw(st.sampled_from(["stop", "length", "tool_calls", "stop_sequence"]))))
        elif draw(st.integers(0, 3)) == 0:
            events.append(c.UpstreamError("boom"))
    return events, draw(st.sampled_from(["finish", "fail"])), draw(st.sampled_from(["chat", "generate"]))


@settings(max_examples=examples(300), deadline=None)
@given(event_sequences())
def test_property_any_event_sequence_is_a_well_formed_stream(seq):
    events, end, endpoint = seq
    enc = new(endpoint)
    chunks = [enc.feed(e) for e in events]
    chunks.append(enc.finish(T) if end == "finish" else enc.fail("api_error", "gone"))
    for piece in chunks:  # each feed writes whole lines or nothing
        assert piece == b"" or (piece.endswith(b"\n") and b"\n\n" not in piece)
    raw = b"".join(chunks)
    objs = check_ndjson(raw, endpoint)
    assert ("error" in objs[-1]) != bool(objs[-1].get("done"))  # ends complete or failed, never both
    text = "".join(e.text for e in events[: _cut(events)] if isinstance(e, c.TextDelta))
    if "error" not in objs[-1]:
        got = "".join(o["message"]["content"] if endpoint == "chat" else o["response"] for o in objs)
        assert got == text


def _cut(events) -> int:
    return next((k for k, e in enumerate(events) if isinstance(e, c.UpstreamError)), len(events))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(upstream_streams(), st.sampled_from(["stream", "whole"]))
def test_property_upstream_chunks_through_decoder_and_encoder(stream, mode):
    chunks, exp = stream
    dec = ChunkDecoder()
    events = [ev for p in chunks for ev in dec.feed(p)]
    assert dec.done
    if mode == "whole":
        asm = WholeAssembler(model="reasoning:latest", clock=lambda: STAMP)
        for ev in events:
            asm.feed(ev)
        msg = ollama.ChatResponse(**asm.result(T))
        content, thinking = msg.message.content, msg.message.thinking or ""
        calls, last = msg.message.tool_calls or [], msg
    else:
        enc = new()
        raw = b"".join(enc.feed(ev) for ev in events) + enc.finish(T)
        check_ndjson(raw)
        parts = sdk_chat(raw)
        content = "".join(p.message.content or "" for p in parts)
        thinking = "".join(p.message.thinking or "" for p in parts)
        calls = [tc for p in parts for tc in (p.message.tool_calls or [])]
        last = parts[-1]
    assert content == exp["content"]
    assert thinking == exp["reasoning"]
    assert [(tc.function.name, dict(tc.function.arguments)) for tc in calls] == [
        (name, json.loads(args)) for _, name, args in exp["tools"]]
    assert last.done and last.done_reason == ("length" if exp["finish"] == "length" else "stop")
    assert last.prompt_eval_count == exp["prompt"]


def test_tool_json_fixtures_are_objects():
    assert all(isinstance(json.loads(s), dict) for s in TOOL_JSON)


def test_unicode_line_separators_stay_inside_their_line():
    # the Python library reads lines with httpx's iter_lines (str.splitlines): NEL, LS and PS
    # would split an object in two; hypothesis found NEL in a reasoning delta
    raw = encode([c.ReasoningDelta("a\x85b"), c.TextDelta("c\u2028d\u2029e"), c.Finish("stop")])
    assert len(raw.decode().splitlines()) == 3
    parts = sdk_chat(raw)
    assert parts[0].message.thinking == "a\x85b" and parts[1].message.content == "c\u2028d\u2029e"
