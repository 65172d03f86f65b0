"""vLLM's `usage.completion_tokens_details.reasoning_tokens` (0.32 with a reasoning parser) through
the decoder and canonical usage into each dialect, as that dialect counts:
- Responses: `output_tokens_details.reasoning_tokens` is vLLM's figure (the gateway's own count of
  reasoning deltas only when the upstream reports none);
- Gemini: `thoughtsTokenCount` the reasoning tokens and `candidatesTokenCount` the rest, the total
  both (as Google counts); no `thoughtsTokenCount` when there were none;
- OpenAI: vLLM's usage object as it sent it; Anthropic and Ollama have no such field: their output
  count is every completion token, thinking included."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.canonical import Finish, ReasoningDelta, TextDelta, Usage
from homelab_frontend.surfaces.gemini.rules import usage_metadata
from homelab_frontend.upstream.decode import ChunkDecoder, decode_completion
from tests.unit.surfaces.responses.test_stream import check_stream, encode, sdk_final_response

# as vLLM 0.32 sends it (the server of tests/real/test_vllm_*.py: 12 of 24 tokens were reasoning)
VLLM_USAGE = {"prompt_tokens": 10, "total_tokens": 34, "completion_tokens": 24,
              "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": 0, "multimodal_tokens": None},
              "completion_tokens_details": {"reasoning_tokens": 12}}


def test_the_decoder_reads_vllms_reasoning_tokens_from_a_usage_chunk_and_a_whole_answer():
    final = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": VLLM_USAGE}
    events = ChunkDecoder().feed(json.dumps(final).encode())
    assert events == [Usage(10, 24, 0, 12)]
    whole = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": VLLM_USAGE,
             "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": 106,
                          "message": {"role": "assistant", "content": "Hello!", "reasoning": "Greet."}}]}
    usage = [e for e in decode_completion(json.dumps(whole).encode()) if isinstance(e, Usage)]
    assert usage == [Usage(10, 24, 0, 12)]


def test_without_the_field_the_count_stays_unreported():
    u = dict(VLLM_USAGE)
    del u["completion_tokens_details"]
    chunk = {"object": "chat.completion.chunk", "choices": [], "usage": u}
    assert ChunkDecoder().feed(json.dumps(chunk).encode()) == [Usage(10, 24, 0, None)]


def test_responses_reports_vllms_reasoning_count_not_its_own_delta_count():
    # two reasoning deltas, but vLLM says 12 of 24 tokens were reasoning (a chunk may hold several)
    raw, _ = encode([ReasoningDelta("a"), ReasoningDelta("b"), TextDelta("x"), Usage(10, 24, 0, 12), Finish("stop")])
    usage = check_stream(raw)[-1]["response"]["usage"]
    assert usage["output_tokens"] == 24 and usage["output_tokens_details"] == {"reasoning_tokens": 12}
    assert sdk_final_response(raw).usage.output_tokens_details.reasoning_tokens == 12
    # a reported 0 is vLLM's word too: an answer without reasoning
    raw, _ = encode([TextDelta("x"), Usage(10, 3, 0, 0), Finish("stop")])
    assert check_stream(raw)[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


def test_responses_counts_deltas_when_the_upstream_reports_none():
    raw, _ = encode([ReasoningDelta("a"), ReasoningDelta("b"), TextDelta("x"), Usage(5, 4), Finish("stop")])
    assert check_stream(raw)[-1]["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


def test_gemini_counts_the_thoughts_apart_from_the_candidates():
    assert usage_metadata(Usage(10, 24, 0, 12)) == {
        "promptTokenCount": 10, "candidatesTokenCount": 12, "thoughtsTokenCount": 12,
        "totalTokenCount": 34, "cachedContentTokenCount": 0}
    # none reported, or none spent: no thoughtsTokenCount, the candidates are every token
    assert usage_metadata(Usage(10, 3, None, 0)) == {"promptTokenCount": 10, "candidatesTokenCount": 3,
                                                     "totalTokenCount": 13}
    assert usage_metadata(Usage(10, 3)) == {"promptTokenCount": 10, "candidatesTokenCount": 3, "totalTokenCount": 13}


_n = st.integers(min_value=0, max_value=10**6)


@given(_n, _n, st.one_of(st.none(), _n))
def test_gemini_candidates_and_thoughts_add_up_to_vllms_completion_tokens(prompt, completion, reasoning):
    meta = usage_metadata(Usage(prompt, completion, None, reasoning))
    assert meta["candidatesTokenCount"] + meta.get("thoughtsTokenCount", 0) == completion
    assert meta["totalTokenCount"] == prompt + completion
    assert meta["candidatesTokenCount"] >= 0 and meta.get("thoughtsTokenCount", 1) > 0
