"""tests/support/wire_shape.py, the structural comparison the stub-vs-vLLM parity test rests on:
it must ignore values and repeat counts, and must see every difference of names, types and order."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from support.wire_shape import diff, grammar, kind, paths, stream_diff, uncoalesced

ROLE = {"role": "assistant", "content": ""}


def chunk(delta=None, finish=None, usage=None, choices=True, **extra):
    c = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    c["choices"] = [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish, **extra}] \
        if choices else []
    if usage is not None:
        c["usage"] = usage
    return c


def usage(n):
    return {"prompt_tokens": 3, "total_tokens": 3 + n, "completion_tokens": n}


def stream(reasoning: int, content: int, with_usage: bool = True) -> list[dict]:
    out = [chunk(ROLE)]
    out += [chunk({"reasoning": f"r{i} "}) for i in range(reasoning)]
    out += [chunk({"content": f"c{i} "}) for i in range(content)]
    out.append(chunk({"content": ""}, finish="stop", stop_reason=None))
    if with_usage:
        out.append(chunk(choices=False, usage=usage(reasoning + content)))
    return out


def parsed(reasoning: int, content: int) -> list[dict]:
    """A stream of vLLM with a reasoning parser, as an idle vLLM sends it: the end of turn (its
    stop token) brings no text, so the finishing chunk's delta is `{}`."""
    out = stream(reasoning, content)
    out[-2] = chunk({}, finish="stop", stop_reason=106)
    return out


def coalesce(chunks: list[dict], cuts: list[int]) -> list[dict]:
    """What vLLM's output collector makes of a stream when its API server falls behind: the
    deltas between two cuts merged into one chunk (texts joined), the finish on the last."""
    head, body, tail = chunks[:1], chunks[1:-1], chunks[-1:]
    out = list(head)
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:]):
        merged: dict = {}
        for c in body[a:b]:
            for key, value in c["choices"][0]["delta"].items():
                merged[key] = merged.get(key, "") + value
        last = body[b - 1]["choices"][0]
        extra = {"stop_reason": last["stop_reason"]} if "stop_reason" in last else {}
        out.append(chunk(merged, finish=last["finish_reason"], **extra))
    return out + tail


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


def test_paths_name_fields_and_types_not_values():
    doc = {"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}}, {"index": 1, "delta": {}}], "u": None}
    assert paths(doc) == {
        "$: object", "$.id: str", "$.u: null", "$.choices: list", "$.choices[]: object",
        "$.choices[].index: int", "$.choices[].delta: object", "$.choices[].delta.content: str",
    }
    assert paths({"a": True, "b": 1.5, "c": []}) == {"$: object", "$.a: bool", "$.b: float", "$.c: list"}


@given(json_values)
def test_a_document_has_the_shape_of_its_json_round_trip(doc):
    assert paths(json.loads(json.dumps(doc))) == paths(doc)


@given(st.integers(0, 5), st.integers(1, 5), st.integers(0, 5), st.integers(1, 5))
def test_streams_of_other_lengths_read_alike(r1, c1, r2, c2):
    if (r1 == 0) != (r2 == 0):
        return  # a stream without reasoning has another grammar, rightly
    assert stream_diff(stream(r1, c1), stream(r2, c2)) == []


def test_the_grammar_of_a_stream():
    tool = [chunk(ROLE), chunk({"content": None, "tool_calls": [{"id": "t", "type": "function", "index": 0,
                                                                 "function": {"name": "f"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            chunk({}, finish="tool_calls", stop_reason=None), chunk(choices=False, usage=usage(3))]
    assert grammar(tool) == ["open", "tool-start", "tool-args", "finish", "usage-only"]
    assert grammar(stream(2, 3)) == ["open", "reasoning", "content", "finish", "usage-only"]
    assert kind({"error": {"message": "x"}}) == "error"


def test_what_a_difference_looks_like():
    a, b = stream(1, 2), stream(1, 2)
    b[-2]["choices"][0]["stop_reason"] = 106
    assert stream_diff(a, b) == ["[finish] only vllm: $.choices[].stop_reason: int",
                                 "[finish] only stub: $.choices[].stop_reason: null"]
    c = stream(1, 2, with_usage=False)
    assert stream_diff(a, c)[0].startswith("chunk order: stub ['open', 'reasoning', 'content', 'finish', 'usage-only']")
    d = [dict(x, usage=usage(0)) if x["choices"] else x for x in stream(1, 2)]
    assert "[content] only vllm: $.usage.total_tokens: int" in stream_diff(a, d)
    assert diff({"$.x: int"}, {"$.x: str"}, "one", "two") == ["only one: $.x: int", "only two: $.x: str"]


def test_a_stream_vllm_coalesced_on_a_busy_machine_reads_as_the_stubs():
    """The full suite's failure (test_vllm_parity, at load 16): vLLM's API server fell behind its
    engine, and the end of the reasoning, the whole content and the finish came in one chunk."""
    stub = parsed(3, 4)
    busy_usage = chunk(choices=False, usage=usage(7))
    busy = stub[:3] + [chunk({"reasoning": "r2 ", "content": "c0 c1 c2 c3 "}, finish="stop", stop_reason=106),
                       busy_usage]
    assert grammar(busy) == ["open", "reasoning", "finish", "usage-only"]  # as the run saw it
    assert grammar(uncoalesced(busy)) == grammar(stub) == ["open", "reasoning", "content", "finish", "usage-only"]
    assert stream_diff(stub, busy) == []
    assert uncoalesced(busy)[-2:] == [chunk({}, finish="stop", stop_reason=106), busy_usage]
    assert uncoalesced(busy)[-3] == chunk({"content": "c0 c1 c2 c3 "})


def test_uncoalescing_keeps_what_is_no_payload_and_splits_a_tool_calls_start_from_its_arguments():
    hidden = [chunk(ROLE), chunk({"content": "a b", "reasoning": None}, finish="stop", stop_reason=106)]
    assert uncoalesced(hidden)[1:] == [chunk({"content": "a b", "reasoning": None}),
                                       chunk({}, finish="stop", stop_reason=106)]
    start = {"id": "t", "type": "function", "index": 0, "function": {"name": "f", "arguments": '{"a": 1}'}}
    tool = [chunk(ROLE), chunk({"reasoning": "r", "content": None, "tool_calls": [start]}, finish="tool_calls",
                               stop_reason=None)]
    assert grammar(uncoalesced(tool)) == ["open", "reasoning", "tool-start", "tool-args", "finish"]
    assert uncoalesced(tool)[2]["choices"][0]["delta"] == {
        "content": None, "tool_calls": [{"id": "t", "type": "function", "index": 0, "function": {"name": "f"}}]}
    assert uncoalesced(tool)[3]["choices"][0]["delta"] == {
        "content": None, "tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}
    plain = parsed(2, 2)
    assert uncoalesced(plain) == plain  # one kind per chunk: nothing to split


@given(st.integers(0, 4), st.integers(1, 4), st.lists(st.integers(0, 20), max_size=4))
def test_any_coalescing_of_a_stream_reads_as_the_stream(reasoning, content, cuts):
    idle = parsed(reasoning, content)
    assert stream_diff(idle, coalesce(idle, cuts)) == []
