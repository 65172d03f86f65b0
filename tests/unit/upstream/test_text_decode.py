"""Legacy completion chunks and llama.cpp's /infill objects -> canonical events."""

from __future__ import annotations

import json

from homelab_frontend import canonical as c
from homelab_frontend.upstream.text_decode import InfillDecoder, TextChunkDecoder


def j(obj) -> bytes:
    return json.dumps(obj).encode()


def test_vllm_chunks_with_continuous_usage_and_stop_reason():
    d = TextChunkDecoder()
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    assert d.feed(j({**head, "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})) == [
        c.Usage(3, 1, None), c.TextDelta("a")]
    assert d.feed(j({**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop", "stop_reason": "\n"}]})) == [
        c.Finish("stop_sequence", "\n")]
    assert d.feed(j({**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                       "prompt_tokens_details": {"cached_tokens": 2}}})) == [c.Usage(3, 1, 2)]
    assert d.feed(b"[DONE]") == [] and d.done


def test_errors_and_wrong_objects_are_one_upstream_error():
    assert isinstance(TextChunkDecoder().feed(j({"error": {"message": "bad", "code": 500}}))[0], c.UpstreamError)
    assert isinstance(TextChunkDecoder().feed(b"{nope")[0], c.UpstreamError)
    got = TextChunkDecoder().feed(j({"object": "chat.completion.chunk", "choices": []}))
    assert isinstance(got[0], c.UpstreamError) and "chat.completion.chunk" in got[0].message
    d = TextChunkDecoder()
    assert isinstance(d.feed(j({"choices": [{"text": "", "finish_reason": "abort"}]}))[-1], c.UpstreamError)
    assert d.feed(j({"choices": [{"text": "x"}]})) == []  # nothing after a failure


def test_llamacpp_infill_stream():
    d = InfillDecoder()
    assert d.feed(j({"index": 0, "content": " x", "stop": False, "tokens_predicted": 1, "tokens_evaluated": 9})) == [
        c.Usage(9, 1, None), c.TextDelta(" x")]
    assert d.feed(j({"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 1,
                     "tokens_evaluated": 9, "timings": {}})) == [c.Usage(9, 1, None), c.Finish("length")]
    assert d.done
    assert InfillDecoder().feed(j({"content": "", "stop": True, "stop_type": "eos"}))[-1] == c.Finish("stop")


def test_llamacpp_last_object_ends_the_stream_whatever_fields_it_kept():
    """`response_fields` trims llama.cpp's last object (llama.vim's: content, timings/..., no
    `stop`; its warm-up's `[""]`: `{}`): every partial says `"stop": false`, so an object that
    does not is the last one, and the stream is finished, not broken."""
    d = InfillDecoder()
    assert d.feed(j({"content": " x", "stop": False, "tokens_predicted": 1, "tokens_evaluated": 9})) == [
        c.Usage(9, 1, None), c.TextDelta(" x")]
    assert not d.done
    assert d.feed(j({"content": "", "timings/prompt_n": 9, "truncated": False, "tokens_cached": 10})) == [
        c.Finish("stop")]
    assert d.done
    warm = InfillDecoder()
    assert warm.feed(b"{}") == [c.Finish("stop")] and warm.done


def test_llamacpp_cached_prompt_tokens_are_timings_cache_n():
    got = InfillDecoder().feed(j({"content": "", "stop": True, "tokens_predicted": 2, "tokens_evaluated": 9,
                                  "timings": {"cache_n": 7, "prompt_n": 2}}))
    assert got[0] == c.Usage(9, 2, 7)
