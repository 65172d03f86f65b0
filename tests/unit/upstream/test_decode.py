"""ChunkDecoder / decode_completion: field by field, on chunks as vLLM, Ollama and llama.cpp send them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
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
from homelab_frontend.upstream.decode import ChunkDecoder, decode_completion, strip_think


def feed_all(payloads: list[bytes]) -> tuple[ChunkDecoder, list]:
    dec = ChunkDecoder()
    out = []
    for p in payloads:
        out.extend(dec.feed(p))
    return dec, out


# ---------------------------------------------------------------------------------------------
# vLLM (model_dump_json(exclude_unset=True); stream_options include_usage + continuous_usage_stats)
# ---------------------------------------------------------------------------------------------

VLLM_R1_STREAM = [
    # first chunk: role and empty content, usage from continuous_usage_stats
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}',
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[{"index":0,"delta":{"reasoning":"Okay"},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}',
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[{"index":0,"delta":{"reasoning":", the user"},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2}}',
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[{"index":0,"delta":{"content":"\\n\\nHello"},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3}}',
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}],'
    b'"usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4}}',
    # usage-only final chunk (exclude_none)
    b'{"id":"chatcmpl-b1f0","object":"chat.completion.chunk","created":1761000000,"model":"reasoning",'
    b'"choices":[],"usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4}}',
    b"[DONE]",
]


def test_vllm_reasoning_stream_field_by_field():
    dec = ChunkDecoder()
    assert dec.feed(VLLM_R1_STREAM[0]) == [Usage(9, 0)]  # role + "" content: no content event
    assert dec.feed(VLLM_R1_STREAM[1]) == [Usage(9, 1), ReasoningDelta("Okay")]
    assert dec.feed(VLLM_R1_STREAM[2]) == [Usage(9, 2), ReasoningDelta(", the user")]
    assert dec.feed(VLLM_R1_STREAM[3]) == [Usage(9, 3), TextDelta("\n\nHello")]
    # finish + content in one chunk: usage, content, then finish
    assert dec.feed(VLLM_R1_STREAM[4]) == [Usage(9, 4), TextDelta("!"), Finish("stop")]
    assert dec.finished
    assert dec.feed(VLLM_R1_STREAM[5]) == [Usage(9, 4)]
    assert not dec.done
    assert dec.feed(VLLM_R1_STREAM[6]) == []
    assert dec.done
    assert dec.feed(b'{"choices":[{"delta":{"content":"late"}}]}') == []  # after [DONE]: ignored


def test_vllm_compat_both_reasoning_keys_emitted_once():
    # vLLM 0.11.1 .. 0.15: `reasoning` plus the `reasoning_content` alias, same text
    p = b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning":"Hm","reasoning_content":"Hm"},"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("Hm")]
    # one of them null
    p = b'{"choices":[{"index":0,"delta":{"reasoning":null,"reasoning_content":"Hm"},"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("Hm")]
    p = b'{"choices":[{"index":0,"delta":{"reasoning":"Hm","reasoning_content":null},"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("Hm")]
    # empty `reasoning` does not hide a non-empty `reasoning_content`
    p = b'{"choices":[{"index":0,"delta":{"reasoning":"","reasoning_content":"Hm"}}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("Hm")]
    # differing: `reasoning` wins, emitted once
    p = b'{"choices":[{"index":0,"delta":{"reasoning":"A","reasoning_content":"B"}}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("A")]


def _reasoning_chunk(text: str, key: str = "reasoning") -> bytes:
    return json.dumps({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "reasoning",
                       "choices": [{"index": 0, "delta": {key: text}, "logprobs": None, "finish_reason": None}]},
                      separators=(",", ":")).encode()


def test_vllm_stray_think_tag_in_a_merged_first_delta_is_dropped():
    # vLLM 0.32's deepseek_r1 parser, when <think> arrives with the next tokens in one delta (its
    # API server merged engine steps on a busy machine): the tag lands in the reasoning
    dec = ChunkDecoder()
    assert dec.feed(_reasoning_chunk("<think>Two and two")) == [ReasoningDelta("Two and two")]
    # only the first reasoning text of an answer: later text is the model's own words
    assert dec.feed(_reasoning_chunk("<think> again")) == [ReasoningDelta("<think> again")]
    # the tag alone: no event for the empty rest, and the next text is kept whole
    dec = ChunkDecoder()
    assert dec.feed(_reasoning_chunk("<think>")) == []
    assert dec.feed(_reasoning_chunk("<think>x")) == [ReasoningDelta("<think>x")]
    # the compat key too, and a whole answer the same way
    assert ChunkDecoder().feed(_reasoning_chunk("<think>Hm", "reasoning_content")) == [ReasoningDelta("Hm")]
    body = (b'{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
            b'"reasoning":"<think>Hm","content":"Hi"},"finish_reason":"stop"}]}')
    assert decode_completion(body) == [ReasoningDelta("Hm"), TextDelta("Hi"), Finish("stop")]


@given(st.text(max_size=40), st.sampled_from(["reasoning", "reasoning_content"]))
def test_strip_think_drops_the_tag_and_keeps_the_rest_of_the_chunk(rest, key):
    chunk = _reasoning_chunk("<think>" + rest, key)
    out = strip_think(chunk)
    doc, want = json.loads(out), json.loads(chunk)
    want["choices"][0]["delta"][key] = rest
    assert doc == want and list(doc) == list(want)  # the same fields, in the same order
    # what the relay sends is what the translating surfaces' decoder reads (one tag at most)
    if not rest.startswith("<think>"):
        assert ChunkDecoder().feed(out) == ([ReasoningDelta(rest)] if rest else [])


def test_vllm_old_reasoning_content_only():
    p = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"think"},"logprobs":null,"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("think")]


def test_vllm_stop_reason_string_is_stop_sequence():
    p = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":"###"}]}'
    assert ChunkDecoder().feed(p) == [Finish("stop_sequence", "###")]


@pytest.mark.parametrize("stop_reason", [b"null", b"151643", b'""'])
def test_vllm_stop_reason_int_or_null_is_plain_stop(stop_reason):
    p = (
        b'{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":'
        + stop_reason
        + b"}]}"
    )
    assert ChunkDecoder().feed(p) == [Finish("stop")]


@pytest.mark.parametrize(
    "reason,expected",
    [
        ("stop", Finish("stop")),
        ("length", Finish("length")),
        ("tool_calls", Finish("tool_calls")),
        ("function_call", Finish("tool_calls")),
        ("content_filter", Finish("content_filter")),
        ("something_new", Finish("stop")),
    ],
)
def test_finish_reasons(reason, expected):
    p = b'{"choices":[{"index":0,"delta":{},"finish_reason":"%s"}]}' % reason.encode()
    assert ChunkDecoder().feed(p) == [expected]


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_vllm_abort_or_error_finish_is_upstream_error(reason):
    p = b'{"choices":[{"index":0,"delta":{},"finish_reason":"%s","stop_reason":null}]}' % reason.encode()
    (ev,) = ChunkDecoder().feed(p)
    assert isinstance(ev, UpstreamError) and reason in ev.message


VLLM_HERMES_TOOL_STREAM = [
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-4f1c2a","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\""}}]},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]},"logprobs":null,"finish_reason":null}]}',
    # second call
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-77aa","type":"function","index":1,"function":{"name":"get_time"}}]},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\\"tz\\": \\"CET\\""}}]},"logprobs":null,"finish_reason":null}]}',
    # end-of-stream "unstreamed arguments" fix-up for the LAST call, in the finish chunk
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}]}',
    b'{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[],"usage":{"prompt_tokens":120,"total_tokens":160,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":64}}}',
    b"[DONE]",
]


def test_vllm_streamed_tool_calls():
    dec, out = feed_all(VLLM_HERMES_TOOL_STREAM)
    assert out == [
        ToolCallStart(0, "chatcmpl-tool-4f1c2a", "get_weather"),
        ToolArgsDelta(0, '{"city": "'),
        ToolArgsDelta(0, "Paris"),
        ToolCallStart(1, "chatcmpl-tool-77aa", "get_time"),
        ToolArgsDelta(1, '{"tz": "CET"'),
        ToolArgsDelta(1, "}"),
        Finish("tool_calls"),
        Usage(120, 40, 64),
    ]
    assert dec.done


def test_first_fragment_arguments_are_emitted():
    p = b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"abc","type":"function","function":{"name":"f","arguments":"{\\"a\\""}}]}}]}'
    assert ChunkDecoder().feed(p) == [ToolCallStart(0, "abc", "f"), ToolArgsDelta(0, '{"a"')]
    p = b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"abc","type":"function","function":{"name":"f","arguments":""}}]}}]}'
    assert ChunkDecoder().feed(p) == [ToolCallStart(0, "abc", "f")]


def test_empty_tool_calls_list_is_ignored_and_content_kept():
    # vLLM chunks with content plus `tool_calls: []` (LiteLLM #29286 turned them into empty args)
    p = b'{"choices":[{"index":0,"delta":{"content":"Let me check.","tool_calls":[]},"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [TextDelta("Let me check.")]


def test_content_then_new_tool_call_in_one_delta():
    p = (
        b'{"choices":[{"index":0,"delta":{"content":"Checking.","tool_calls":[{"index":0,"id":"call_1",'
        b'"type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}'
    )
    assert ChunkDecoder().feed(p) == [TextDelta("Checking."), ToolCallStart(0, "call_1", "f"), ToolArgsDelta(0, "{}")]


def test_continuation_args_go_before_content_in_the_same_delta():
    # vllm PR #45287: the "\n" after </tool_call> arrives with the call's last argument bytes
    dec = ChunkDecoder()
    dec.feed(b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","function":{"name":"f","arguments":"{\\"a\\":"}}]}}]}')
    p = b'{"choices":[{"index":0,"delta":{"content":"\\nDone.","tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}'
    assert dec.feed(p) == [ToolArgsDelta(0, "1}"), TextDelta("\nDone.")]


def _content(text: str) -> bytes:
    return b'{"choices":[{"index":0,"delta":{"content":%s}}]}' % json.dumps(text).encode()


def _call(index: int, call_id: str | None, name: str | None, args: str) -> bytes:
    fn: dict = {"arguments": args}
    tc: dict = {"index": index, "function": fn}
    if name is not None:
        fn["name"] = name
    if call_id is not None:
        tc["id"] = call_id
    return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [tc]}}]}).encode()


def test_whitespace_after_a_call_is_held_so_late_arguments_stay_with_their_call():
    # vllm PR #45287: the "\n" after </tool_call> streamed as content in a chunk of its own, then
    # the call's last argument bytes (the end-of-stream fix-up). Held, the "\n" cannot split them
    # from their call in a dialect that closes a call's block when text follows.
    _, out = feed_all([
        _call(0, "call_1", "f", '{"a": '),
        _content("\n"),
        _call(0, None, None, "1}"),
        _content("\n"),
        _content("Done."),  # not whitespace: goes out with what was held in front of it
        _call(1, "call_2", "g", "{}"),
        _content(" \n"),  # held, then dropped by the end
        b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
        b"[DONE]",
    ])
    assert out == [ToolCallStart(0, "call_1", "f"), ToolArgsDelta(0, '{"a": '), ToolArgsDelta(0, "1}"),
                   TextDelta("\n\nDone."), ToolCallStart(1, "call_2", "g"), ToolArgsDelta(1, "{}"),
                   Finish("tool_calls")]


def test_whitespace_held_after_a_call_is_dropped_by_reasoning_or_another_call():
    _, out = feed_all([_call(0, "c1", "f", "{}"), _content("\n"), _reasoning_chunk("hm"), _content(" x")])
    assert out == [ToolCallStart(0, "c1", "f"), ToolArgsDelta(0, "{}"), ReasoningDelta("hm"), TextDelta(" x")]
    _, out = feed_all([_call(0, "c1", "f", "{}"), _content("\n"), _call(1, "c2", "g", "{}"), _content("y")])
    assert out == [ToolCallStart(0, "c1", "f"), ToolArgsDelta(0, "{}"), ToolCallStart(1, "c2", "g"),
                   ToolArgsDelta(1, "{}"), TextDelta("y")]


def test_whitespace_is_held_only_after_a_call():
    _, out = feed_all([_content("\n"), _content(" "), _content("a"), _content("\n")])
    assert out == [TextDelta("\n"), TextDelta(" "), TextDelta("a"), TextDelta("\n")]
    _, out = feed_all([_call(0, "c1", "f", "{}"), _content("ok"), _content("\n")])
    assert out[-2:] == [TextDelta("ok"), TextDelta("\n")]  # text came after the call: nothing held


def test_tool_finish_stop_with_calls_becomes_tool_calls():
    # vLLM named tool_choice: finish_reason "stop" although a call was made
    _, out = feed_all(
        [
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}]}',
            b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":null}]}',
        ]
    )
    assert out[-1] == Finish("tool_calls")


def test_usage_first_when_a_chunk_has_usage_and_deltas():
    p = b'{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
    assert ChunkDecoder().feed(p) == [Usage(3, 1), TextDelta("Hi"), Finish("length")]


def test_usage_with_cached_tokens_and_null_details():
    p = b'{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":80}}}'
    assert ChunkDecoder().feed(p) == [Usage(100, 5, 80)]
    p = b'{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":null}}'
    assert ChunkDecoder().feed(p) == [Usage(100, 5, None)]
    assert ChunkDecoder().feed(b'{"choices":[],"usage":null}') == []
    assert ChunkDecoder().feed(b'{"choices":[],"usage":{}}') == []


def test_vllm_error_chunks():
    # current vLLM: create_streaming_error_response -> {"error": {...}}
    p = b'{"error":{"message":"The decoder prompt is too long","type":"BadRequestError","param":null,"code":400}}'
    assert ChunkDecoder().feed(p) == [UpstreamError("The decoder prompt is too long")]
    # older vLLM: {"object":"error", ...}
    p = b'{"object":"error","message":"CUDA out of memory","type":"InternalServerError","param":null,"code":500}'
    assert ChunkDecoder().feed(p) == [UpstreamError("CUDA out of memory")]
    p = b'{"error":{"message":"busy","type":"ServiceUnavailableError","code":503}}'
    assert ChunkDecoder().feed(p) == [UpstreamError("busy", "overloaded_error")]


@pytest.mark.parametrize(
    "payload",
    [b"{not json", b'{"choices": [', b"", b"42", b'"str"', b'{"choices":"nope"}', b'{"choices":[{"delta":{"content":5}}]}'],
)
def test_malformed_payload_is_upstream_error_never_raises(payload):
    (ev,) = ChunkDecoder().feed(payload)
    assert isinstance(ev, UpstreamError)
    assert ev.kind == "api_error"


def test_done_variants():
    for p in (b"[DONE]", b"[DONE]\r", b" [DONE]\n"):
        dec = ChunkDecoder()
        assert dec.feed(p) == [] and dec.done


def test_unknown_fields_and_chunk_without_choices_are_tolerated():
    p = b'{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp","kv_transfer_params":null,"choices":[{"index":0,"delta":{"content":"a","extra":{"x":1}},"token_ids":[1,2],"finish_reason":null}],"prompt_token_ids":null}'
    assert ChunkDecoder().feed(p) == [TextDelta("a")]
    assert ChunkDecoder().feed(b'{"id":"x","object":"chat.completion.chunk"}') == []


def test_only_first_choice_matters():
    p = b'{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}'
    assert ChunkDecoder().feed(p) == [TextDelta("a")]


# ---------------------------------------------------------------------------------------------
# Ollama (/v1/chat/completions, stream_options.include_usage)
# ---------------------------------------------------------------------------------------------

OLLAMA_TEXT_STREAM = [
    b'{"id":"chatcmpl-768","object":"chat.completion.chunk","created":1744445346,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}',
    b'{"id":"chatcmpl-768","object":"chat.completion.chunk","created":1744445346,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"lo"},"finish_reason":null}]}',
    b'{"id":"chatcmpl-768","object":"chat.completion.chunk","created":1744445346,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}',
    b'{"id":"chatcmpl-768","object":"chat.completion.chunk","created":1744445346,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32}}',
    b"[DONE]",
]


def test_ollama_text_stream():
    dec, out = feed_all(OLLAMA_TEXT_STREAM)
    assert out == [TextDelta("Hel"), TextDelta("lo"), Finish("stop"), Usage(30, 2)]
    assert dec.done


def test_ollama_whole_tool_calls_in_one_delta_each():
    _, out = feed_all(
        [
            b'{"id":"chatcmpl-18","object":"chat.completion.chunk","created":1744446075,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_wteop8bt","index":0,"type":"function","function":{"name":"run_command","arguments":"{\\"command\\":\\"ls\\"}"}}]},"finish_reason":null}]}',
            b'{"id":"chatcmpl-18","object":"chat.completion.chunk","created":1744446075,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_rk2xye1l","index":1,"type":"function","function":{"name":"run_command","arguments":"{\\"command\\":\\"ls -l\\"}"}}]},"finish_reason":null}]}',
            b'{"id":"chatcmpl-18","object":"chat.completion.chunk","created":1744446075,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]}',
            b"[DONE]",
        ]
    )
    assert out == [
        ToolCallStart(0, "call_wteop8bt", "run_command"),
        ToolArgsDelta(0, '{"command":"ls"}'),
        ToolCallStart(1, "call_rk2xye1l", "run_command"),
        ToolArgsDelta(1, '{"command":"ls -l"}'),
        Finish("tool_calls"),
    ]


def test_index_reused_for_a_new_call_gets_a_new_canonical_index():
    # servers that number each chunk's calls from 0
    _, out = feed_all(
        [
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"f","arguments":"{}"}}]}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"g","arguments":"{}"}}]}}]}',
        ]
    )
    assert out == [ToolCallStart(0, "call_a", "f"), ToolArgsDelta(0, "{}"), ToolCallStart(1, "call_b", "g"), ToolArgsDelta(1, "{}")]


def test_repeated_id_on_every_fragment_is_a_continuation():
    _, out = feed_all(
        [
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","index":0,"function":{"name":"f","arguments":"{\\"x\\""}}]}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"call_a","index":0,"function":{"name":"f","arguments":":1}"}}]}}]}',
        ]
    )
    assert out == [ToolCallStart(0, "call_a", "f"), ToolArgsDelta(0, '{"x"'), ToolArgsDelta(0, ":1}")]


def test_index_less_calls_and_arguments_as_object():
    _, out = feed_all(
        [
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}},'
            b'{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"x"}}]}}]}',
        ]
    )
    assert out == [
        ToolCallStart(0, "c1", "f"),
        ToolArgsDelta(0, '{"a":1}'),
        ToolCallStart(1, "c2", "g"),
        ToolArgsDelta(1, "{}"),
        ToolArgsDelta(1, "x"),
    ]


def test_fragments_before_the_name_are_held_until_it_arrives():
    _, out = feed_all(
        [
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c9","function":{"arguments":"{"}}]}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"}"}}]}}]}',
        ]
    )
    assert out == [ToolCallStart(0, "c9", "f"), ToolArgsDelta(0, "{}")]


def test_missing_id_gives_empty_id():
    p = b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]}}]}'
    assert ChunkDecoder().feed(p) == [ToolCallStart(0, "", "f"), ToolArgsDelta(0, "{}")]


def test_ollama_reasoning_field():
    p = b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"qwen3:4b","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Let me think"},"finish_reason":null}]}'
    assert ChunkDecoder().feed(p) == [ReasoningDelta("Let me think")]


def test_ollama_error_chunk():
    p = b'{"error":{"message":"model runner has unexpectedly stopped","type":"api_error","param":null,"code":null}}'
    assert ChunkDecoder().feed(p) == [UpstreamError("model runner has unexpectedly stopped")]
    assert ChunkDecoder().feed(b'{"error":"something broke"}') == [UpstreamError("something broke")]


# ---------------------------------------------------------------------------------------------
# llama.cpp (llama-server)
# ---------------------------------------------------------------------------------------------

LLAMACPP_STREAM = [
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","system_fingerprint":"b6500-abc","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"Thinking"}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","system_fingerprint":"b6500-abc","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Answer"}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","system_fingerprint":"b6500-abc","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"oQ2kZ1","type":"function","function":{"name":"lookup","arguments":""}}]}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"q\\":1}"}}]}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"created":1761000000,"id":"chatcmpl-Zq3","model":"gpt-oss","system_fingerprint":"b6500-abc","object":"chat.completion.chunk","usage":{"completion_tokens":12,"prompt_tokens":40,"total_tokens":52,"prompt_tokens_details":{"cached_tokens":32}},"timings":{"prompt_n":8,"predicted_n":12}}',
    b"[DONE]",
]


def test_llamacpp_stream():
    dec, out = feed_all(LLAMACPP_STREAM)
    assert out == [
        ReasoningDelta("Thinking"),
        TextDelta("Answer"),
        ToolCallStart(0, "oQ2kZ1", "lookup"),
        ToolArgsDelta(0, '{"q":1}'),
        Usage(40, 12, 32),
        Finish("tool_calls"),
    ]
    assert dec.done


def test_llamacpp_error_chunk():
    p = b'{"error":{"code":500,"message":"context shift is disabled","type":"server_error"}}'
    assert ChunkDecoder().feed(p) == [UpstreamError("context shift is disabled")]


# ---------------------------------------------------------------------------------------------
# Non-streaming completions
# ---------------------------------------------------------------------------------------------


def test_decode_completion_vllm_reasoning_and_tools():
    body = (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"reasoning","choices":[{"index":0,'
        b'"message":{"role":"assistant","reasoning":"Need weather.","reasoning_content":null,"content":"Checking.",'
        b'"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}},'
        b'{"id":"chatcmpl-tool-2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},'
        b'"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],'
        b'"usage":{"prompt_tokens":50,"total_tokens":70,"completion_tokens":20,"prompt_tokens_details":null},"prompt_logprobs":null}'
    )
    assert decode_completion(body) == [
        Usage(50, 20),
        ReasoningDelta("Need weather."),
        TextDelta("Checking."),
        ToolCallStart(0, "chatcmpl-tool-1", "get_weather"),
        ToolArgsDelta(0, '{"city":"Paris"}'),
        ToolCallStart(1, "chatcmpl-tool-2", "get_time"),
        ToolArgsDelta(1, "{}"),
        Finish("tool_calls"),
    ]


def test_decode_completion_stop_sequence_and_text():
    body = b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"one two","tool_calls":[]},"finish_reason":"stop","stop_reason":"three"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}'
    assert decode_completion(body) == [Usage(5, 2), TextDelta("one two"), Finish("stop_sequence", "three")]


def test_decode_completion_ollama_and_no_finish():
    body = b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen2.5:3b-instruct","system_fingerprint":"fp_ollama","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}'
    assert decode_completion(body) == [Usage(9, 1), TextDelta("Hi"), Finish("length")]
    body = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"}}]}'
    assert decode_completion(body) == [TextDelta("Hi"), Finish("stop")]


@pytest.mark.parametrize(
    "body,fragment",
    [
        (b"not json", "not a chat completion"),
        (b'{"error":{"message":"bad","code":400}}', "error"),
        (b'{"object":"error","message":"bad"}', "error"),
        (b'{"object":"chat.completion","choices":[]}', "no choices"),
        (b'{"object":"chat.completion.chunk","choices":[{"delta":{"content":"x"}}]}', "chat.completion.chunk"),
        (b'{"choices":[{"index":0,"finish_reason":"stop"}]}', "no message"),
        (b"[1,2]", "not a chat completion"),
    ],
)
def test_decode_completion_rejects_non_completions(body, fragment):
    with pytest.raises(ValueError, match=fragment):
        decode_completion(body)
