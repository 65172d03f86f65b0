"""request/drain.py: the usage an upstream reports at the end of its answer, found in the last
bytes of an SSE stream or a whole JSON body; nothing taken from a line that is no usage."""

from __future__ import annotations

from homelab_frontend.request.drain import usage_in_tail


def test_the_last_usage_of_a_stream():
    tail = (b'data: {"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":8,"completion_tokens":3}}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":40}}\n\ndata: [DONE]\n\n')
    assert usage_in_tail(tail) == (8, 40)


def test_a_whole_answers_usage():
    assert usage_in_tail(b'{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}') == (5, 7)


def test_no_usage_or_a_broken_one_is_none():
    assert usage_in_tail(b"") is None
    assert usage_in_tail(b'data: {"choices":[{"delta":{"content":"\\"usage\\""}}]}\n\n') is None
    assert usage_in_tail(b'data: {"usage": {"prompt_tokens": "8", "completion_tokens": 3}}\n') is None
    assert usage_in_tail(b'data: {"usage": {"prompt_tokens": true, "completion_tokens": 3}}\n') is None
    # a line cut at the front of the kept tail is skipped; an earlier whole one is found
    assert usage_in_tail(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":2}}\nens":9}}\n') == (1, 2)
