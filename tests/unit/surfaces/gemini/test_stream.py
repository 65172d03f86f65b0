"""GeminiStreamEncoder and ResponseAssembler: examples, then hypothesis properties, with the
google-genai SDK's own types and streaming client as the oracle (sdk_oracle.py)."""

from __future__ import annotations

import base64
import json
import os

import pytest
from google.genai import errors as genai_errors
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
from homelab_frontend.surfaces.gemini.assemble import ResponseAssembler
from homelab_frontend.surfaces.gemini.rules import reasoning_from
from homelab_frontend.surfaces.gemini.stream import FAILURE_GAP, GeminiStreamEncoder
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.upstream.decode import ChunkDecoder
from tests.unit.surfaces.anthropic.test_stream import TOOL_JSON, upstream_streams
from support import genai_js_stream as genai_js
from tests.unit.surfaces.gemini.sdk_oracle import sdk_stream, sse_chunks, validate, view

SIGNER = ThinkingSigner(b"test-secret")
MODEL = "gemini-2.5-flash"


def examples(n: int) -> int:
    return int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1")))


def encoder(**kw) -> GeminiStreamEncoder:
    kw.setdefault("model", MODEL)
    kw.setdefault("response_id", "resp01")
    kw.setdefault("signer", SIGNER)
    kw.setdefault("include_thoughts", True)
    return GeminiStreamEncoder(**kw)


def encode(events, **kw) -> bytes:
    enc = encoder(**kw)
    return b"".join(enc.feed(e) for e in events) + enc.finish()


def assemble(events, **kw) -> dict:
    kw.setdefault("model", MODEL)
    kw.setdefault("response_id", "resp01")
    kw.setdefault("signer", SIGNER)
    kw.setdefault("include_thoughts", True)
    a = ResponseAssembler(**kw)
    for e in events:
        a.feed(e)
    return a.result()


def opened(sig: bytes) -> str | None:
    """The reasoning in a signature as the SDK hands it back (it holds the field as bytes)."""
    return reasoning_from(SIGNER, base64.b64encode(sig).decode())


# ---------------------------------------------------------------------------------------------
# Examples
# ---------------------------------------------------------------------------------------------

REASON_TEXT = [Usage(9, 0), ReasoningDelta("Okay,"), ReasoningDelta(" greet."), TextDelta("Hel"), TextDelta("lo!"),
               Finish("stop"), Usage(9, 5)]


def test_reasoning_then_text_with_thoughts_shown():
    raw = encode(REASON_TEXT)
    chunks = [json.loads(c) for c in sse_chunks(raw)]
    assert [c["candidates"][0]["content"].get("parts") for c in chunks[:4]] == [
        [{"text": "Okay,", "thought": True}],
        [{"text": " greet.", "thought": True}],
        [{"text": "Hel", "thoughtSignature": chunks[2]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]}],
        [{"text": "lo!"}],
    ]
    last = chunks[-1]
    assert last["candidates"][0] == {"content": {"role": "model"}, "finishReason": "STOP", "index": 0}
    assert last["usageMetadata"] == {"promptTokenCount": 9, "candidatesTokenCount": 5, "totalTokenCount": 14}
    assert all("usageMetadata" not in c for c in chunks[:-1])  # usage on the last chunk only
    assert {c["modelVersion"] for c in chunks} == {MODEL} and {c["responseId"] for c in chunks} == {"resp01"}
    for c in sse_chunks(raw):
        validate(c)
    v = view(sdk_stream(raw))
    assert v["thought"] == "Okay, greet." and v["text"] == "Hello!" and v["finish"] == "STOP"
    assert [opened(s) for s in v["signatures"]] == ["Okay, greet."]
    assert v["usage"].prompt_token_count == 9 and v["usage"].candidates_token_count == 5


def test_hidden_thoughts_are_sealed_into_the_signature_only():
    raw = encode(REASON_TEXT, include_thoughts=False)
    assert b"Okay" not in raw and b'"thought"' not in raw
    v = view(sdk_stream(raw))
    assert v["thought"] == "" and v["text"] == "Hello!"
    assert [opened(s) for s in v["signatures"]] == ["Okay, greet."]


def test_reasoning_with_nothing_after_it_is_sealed_onto_an_empty_text_part():
    raw = encode([ReasoningDelta("hmm"), Finish("length")], include_thoughts=False)
    last = json.loads(sse_chunks(raw)[-1])
    (part,) = last["candidates"][0]["content"]["parts"]
    assert part["text"] == "" and reasoning_from(SIGNER, part["thoughtSignature"]) == "hmm"
    assert last["candidates"][0]["finishReason"] == "MAX_TOKENS"


def test_a_function_call_goes_out_whole_once_complete_even_after_vllms_late_arguments():
    # vllm PR #45287: the "\n" after </tool_call> streamed before the call's last argument bytes,
    # which the chunk decoder holds (tests/unit/upstream/test_decode.py)
    dec = ChunkDecoder()
    chunks = [
        b'{"choices":[{"index":0,"delta":{"reasoning":"plan"}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"chatcmpl-tool-1",'
        b'"function":{"name":"run_shell_command","arguments":"{\\"command\\": \\"ec"}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"\\n"}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ho hi\\"}"}}]}}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],'
        b'"usage":{"prompt_tokens":20,"completion_tokens":7}}',
    ]
    events = [ev for ch in chunks for ev in dec.feed(ch)]
    raw = encode(events)
    chunks = [json.loads(c) for c in sse_chunks(raw)]
    assert len(chunks) == 2  # the thought, then the call with finish and usage
    parts = chunks[-1]["candidates"][0]["content"]["parts"]
    assert len(parts) == 1 and parts[0]["functionCall"] == {
        "id": "chatcmpl-tool-1", "name": "run_shell_command", "args": {"command": "echo hi"}}
    assert reasoning_from(SIGNER, parts[0]["thoughtSignature"]) == "plan"
    v = view(sdk_stream(raw))
    assert v["calls"] == [("chatcmpl-tool-1", "run_shell_command", {"command": "echo hi"})]
    assert v["text"] == "" and v["finish"] == "STOP"


def test_calls_are_sent_in_order_and_ids_are_unique_within_the_answer():
    events = [ToolCallStart(0, "dup", "a"), ToolArgsDelta(0, "{}"), ToolCallStart(1, "dup", "b"),
              ToolArgsDelta(1, '{"x": 1}'), ToolArgsDelta(0, '{"late": 1}'), ToolArgsDelta(7, "{}"),
              ToolCallStart(2, "", "c"), ToolArgsDelta(2, "not json"), Finish("tool_calls")]
    enc = encoder(new_call_id=iter(["call_gen1", "call_gen2"]).__next__)
    raw = b"".join(enc.feed(e) for e in events) + enc.finish()
    v = view(sdk_stream(raw))
    assert v["calls"] == [("dup", "a", {}), ("call_gen1", "b", {"x": 1}), ("call_gen2", "c", {"_raw_arguments": "not json"})]
    assert enc.dropped_tool_args == 2  # the late fragment of a call already sent, and index 7


def test_text_after_a_call_sends_the_call_first():
    events = [ToolCallStart(0, "c1", "f"), ToolArgsDelta(0, "{}"), TextDelta("\n after"), Finish("stop")]
    chunks = [json.loads(c) for c in sse_chunks(encode(events))]
    assert chunks[0]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"id": "c1", "name": "f", "args": {}}}, {"text": "\n after"}]


def test_line_and_paragraph_separators_are_escaped():
    raw = encode([TextDelta("a\u2028b\u2029c\u0085d"), ReasoningDelta("\u2028")])
    assert b"\\u2028" in raw and b"\\u2029" in raw and b"\\u0085" in raw
    assert view(sdk_stream(raw))["text"] == "a\u2028b\u2029c\u0085d"


def test_an_answer_with_no_content_is_one_final_chunk():
    raw = encode([Finish("stop")])
    (chunk,) = sse_chunks(raw)
    assert json.loads(chunk)["candidates"][0] == {"content": {"role": "model"}, "finishReason": "STOP", "index": 0}
    validate(chunk)


def test_unknown_usage_is_left_out_not_zero():
    raw = encode([TextDelta("x"), Usage(output_tokens=3)])
    assert json.loads(sse_chunks(raw)[-1])["usageMetadata"] == {"candidatesTokenCount": 3, "totalTokenCount": 3}
    raw = encode([TextDelta("x")])
    assert "usageMetadata" not in json.loads(sse_chunks(raw)[-1])
    raw = encode([TextDelta("x"), Usage(100, 2, 60)])
    assert json.loads(sse_chunks(raw)[-1])["usageMetadata"] == {
        "promptTokenCount": 100, "candidatesTokenCount": 2, "totalTokenCount": 102, "cachedContentTokenCount": 60}


@pytest.mark.parametrize("reason,want", [("stop", "STOP"), ("length", "MAX_TOKENS"), ("tool_calls", "STOP"),
                                         ("stop_sequence", "STOP"), ("content_filter", "SAFETY")])
def test_finish_reasons(reason, want):
    raw = encode([TextDelta("x"), Finish(reason, "##" if reason == "stop_sequence" else None)])
    assert view(sdk_stream(raw))["finish"] == want


# ---------------------------------------------------------------------------------------------
# Failures after the first chunk: the SDK must raise, never see a short answer
# ---------------------------------------------------------------------------------------------


def test_a_failure_after_the_first_chunk_is_an_error_the_sdk_raises():
    enc = encoder()
    raw = enc.feed(TextDelta("partial")) + enc.feed(UpstreamError("the backend closed the connection"))
    assert enc.ended and enc.failed
    assert enc.finish() == b"" and enc.feed(TextDelta("more")) == b""
    tail = raw.split(b"\r\n\r\n")[-1]
    assert json.loads(tail) == {"error": {"code": 500, "message": "the backend closed the connection", "status": "INTERNAL"}}
    assert not tail.startswith(b"data:")  # outside the SSE framing, as Google sends it
    with pytest.raises(genai_errors.ServerError) as info:
        sdk_stream(raw)
    assert info.value.code == 500 and info.value.status == "INTERNAL"


@pytest.mark.parametrize("kind,code,status", [("timeout_error", 504, "DEADLINE_EXCEEDED"),
                                              ("overloaded_error", 503, "UNAVAILABLE")])
def test_failure_kinds(kind, code, status):
    enc = encoder()
    raw = enc.feed(TextDelta("a")) + enc.feed(UpstreamError("x", kind))
    with pytest.raises(genai_errors.APIError) as info:
        sdk_stream(raw)
    assert (info.value.code, info.value.status) == (code, status)


def test_the_gateways_own_failure_midstream():
    enc = encoder()
    raw = enc.feed(TextDelta("a")) + enc.fail("DEADLINE_EXCEEDED", "the backend went silent")
    with pytest.raises(genai_errors.APIError) as info:
        sdk_stream(raw)
    assert info.value.code == 504 and "went silent" in info.value.message


# ---------------------------------------------------------------------------------------------
# The JSON-array framing (streamGenerateContent without alt=sse)
# ---------------------------------------------------------------------------------------------


def test_array_framing_is_one_json_array_of_chunks():
    raw = encode(REASON_TEXT, framing="array")
    doc = json.loads(raw)
    assert isinstance(doc, list) and len(doc) == 5
    for chunk in doc:
        validate(chunk)
    assert view([validate(c) for c in doc])["text"] == "Hello!"
    assert json.loads(encode([], framing="array"))[0]["candidates"][0]["finishReason"] == "STOP"


def test_array_framing_failure_leaves_the_array_open():
    enc = encoder(framing="array")
    raw = enc.feed(TextDelta("a")) + enc.fail("INTERNAL", "boom")
    with pytest.raises(ValueError):
        json.loads(raw)
    assert json.loads(raw + b"]")[-1] == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
    assert encoder(framing="array").fail("INTERNAL", "x").startswith(b'[{"error"')


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

short_text = st.text(st.sampled_from("ab \n\t\"\\é😀\u2028"), max_size=5)


@st.composite
def event_sequences(draw):
    events, tools = [], []
    for _ in range(draw(st.integers(0, 22))):
        kind = draw(st.sampled_from(["reason", "text", "text", "ws", "tool", "args", "args", "usage", "finish"]))
        if kind == "reason":
            events.append(ReasoningDelta(draw(short_text)))
        elif kind == "text":
            events.append(TextDelta(draw(short_text)))
        elif kind == "ws":
            events.append(TextDelta(draw(st.sampled_from(["\n", " ", ""]))))
        elif kind == "tool":
            tools.append([len(tools), draw(st.sampled_from(TOOL_JSON))])
            events.append(ToolCallStart(len(tools) - 1, draw(st.sampled_from(["", "call_a", "chatcmpl-tool-1"])),
                                        draw(st.sampled_from(["get_weather", "f"]))))
        elif kind == "args" and tools:
            t = tools[-1]
            k = draw(st.integers(0, len(t[1])))
            events.append(ToolArgsDelta(t[0], t[1][:k]))
            t[1] = t[1][k:]
        elif kind == "usage":
            events.append(Usage(draw(st.none() | st.integers(1, 99)), draw(st.none() | st.integers(0, 50))))
        elif kind == "finish":
            events.append(Finish(draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter"]))))
    if tools and draw(st.booleans()):
        events.append(ToolArgsDelta(tools[-1][0], tools[-1][1]))
    return events


def _reference(events, show: bool):
    """What the answer means: thoughts, visible text, the calls, the reasoning the signatures must
    carry."""
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [e.name for e in events if isinstance(e, ToolCallStart)]
    text = [e.text for e in events if isinstance(e, TextDelta)]
    return {"thought": reasoning if show else "", "reasoning": reasoning, "calls": calls, "text": "".join(text)}


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_sequences(), st.booleans(), st.booleans())
def test_property_any_sequence_streams_what_the_whole_answer_holds(events, show, sse):
    enc = encoder(include_thoughts=show, framing="sse" if sse else "array")
    raw = b""
    for e in events:
        out = enc.feed(e)
        raw += out
        if sse:  # unbuffered: whole frames at once
            assert out == b"" or out.endswith(b"\r\n\r\n")
    raw += enc.finish()
    chunks = sse_chunks(raw) if sse else [json.dumps(c).encode() for c in json.loads(raw)]
    streamed = [validate(c) for c in chunks]
    whole = validate(assemble(events, include_thoughts=show))
    vs, vw = view(streamed), view([whole])
    ref = _reference(events, show)
    assert vs["thought"] == vw["thought"] == ref["thought"]
    assert vs["text"] == vw["text"] == ref["text"]
    assert [c[1] for c in vs["calls"]] == [c[1] for c in vw["calls"]] == ref["calls"]
    assert [c[2] for c in vs["calls"]] == [c[2] for c in vw["calls"]]
    ids = [c[0] for c in vs["calls"]]
    assert len(set(ids)) == len(ids) and all(ids)
    # every bit of reasoning travels in exactly one signature, in order
    assert "".join(opened(s) for s in vs["signatures"]) == ref["reasoning"]
    assert "".join(opened(s) for s in vw["signatures"]) == ref["reasoning"]
    assert vs["finish"] == vw["finish"]
    if sse:
        assert view(sdk_stream(raw))["text"] == vs["text"]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(upstream_streams(), st.booleans())
def test_property_upstream_chunks_through_decoder_and_encoder(stream, show):
    chunks, exp = stream
    dec, enc = ChunkDecoder(), encoder(include_thoughts=show)
    raw = b""
    for p in chunks:
        for ev in dec.feed(p):
            raw += enc.feed(ev)
    assert dec.done
    raw += enc.finish()
    v = view(sdk_stream(raw))
    assert v["thought"] == (exp["reasoning"] if show else "")
    assert v["text"] == exp["content"]
    assert [(name, args) for _, name, args in v["calls"]] == exp["tools"]
    assert [cid for cid, _, _ in v["calls"]] == exp["tool_ids"]
    assert "".join(opened(s) for s in v["signatures"]) == exp["reasoning"]
    assert v["finish"] == ("MAX_TOKENS" if exp["stop_reason"] == "max_tokens" else "STOP")
    if exp["prompt"]:
        assert v["usage"].prompt_token_count == exp["prompt"]


# ---------------------------------------------------------------------------------------------
# A failure as Gemini CLI's SDK reads it, whatever the reads (tests/support/genai_js_stream.py)
# ---------------------------------------------------------------------------------------------


def _reads(raw: bytes, cuts: list[int]) -> list[bytes]:
    """`raw` cut at `cuts` (sorted offsets): the reads a client was handed."""
    edges = [0, *cuts, len(raw)]
    return [raw[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def _broken_stream(framing_gap: bool = True) -> tuple[bytes, int]:
    enc = encoder()
    head = b"".join(enc.feed(TextDelta(w)) for w in ("one ", "two ", "three"))
    raw = head + enc.fail("INTERNAL", "the backend closed the connection mid-stream")
    if not framing_gap:
        raw = head + raw[len(head):].lstrip(b" ")
    return raw, raw.index(b'{"error"')


def _cuts():
    """Where reads end: anywhere, and often near the error line and the data before it."""
    raw, at = _broken_stream()
    near = st.integers(max(1, at - 400), min(len(raw) - 1, at + 200))
    return st.lists(st.integers(1, len(raw) - 1) | near, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cuts(), st.integers(1024, genai_js.NODE_MAX_READ))  # a read is a segment or more
def test_gemini_cli_reads_the_failure_whole_however_the_body_is_cut(cuts, split):
    """Any cutting of the body into reads no larger than Node's fetch hands out (a read longer
    than that is cut again, `split` bytes in): the SDK throws the ApiError carrying the
    gateway's words; only a cut inside the error line itself loses them, and that is still a
    failure, never an answer."""
    raw, at = _broken_stream()
    edges = sorted(set(cuts))
    reads, ends, start = [], [], 0
    for end in [*edges, len(raw)]:
        while end - start > genai_js.NODE_MAX_READ:
            cut = start + min(split, genai_js.NODE_MAX_READ)
            reads.append(raw[start:cut])
            ends.append(cut)
            start = cut
        if end > start:
            reads.append(raw[start:end])
            ends.append(end)
            start = end
    assert b"".join(reads) == raw and all(len(r) <= genai_js.NODE_MAX_READ for r in reads)
    if any(at < e < len(raw) - 1 for e in ends):
        with pytest.raises(genai_js.IncompleteJson):
            genai_js.read_stream(reads)
    else:
        with pytest.raises(genai_js.ApiError, match="the backend closed the connection mid-stream"):
            genai_js.read_stream(reads)


def test_a_merged_read_without_the_gap_loses_the_words_and_a_cut_line_is_still_a_failure():
    raw, at = _broken_stream(framing_gap=False)
    with pytest.raises(genai_js.IncompleteJson):  # the last chunk and the line in one read
        genai_js.read_stream([raw])
    raw, at = _broken_stream()
    with pytest.raises(genai_js.IncompleteJson):
        genai_js.read_stream(_reads(raw, [at + 5]))
    # one read of all of it: a busy client, or a proxy that merged every write
    reads = [raw[i:i + genai_js.NODE_MAX_READ] for i in range(0, len(raw), genai_js.NODE_MAX_READ)]
    with pytest.raises(genai_js.ApiError):
        genai_js.read_stream(reads)


def test_the_gap_comes_only_after_a_begun_stream():
    assert encoder().fail("INTERNAL", "x").startswith(b'{"error"')  # nothing before: the line alone
    enc = encoder()
    raw = enc.feed(TextDelta("a")) + enc.fail("INTERNAL", "x")
    assert FAILURE_GAP in raw and len(FAILURE_GAP) >= 2 * genai_js.NODE_MAX_READ  # twice what Node hands out
