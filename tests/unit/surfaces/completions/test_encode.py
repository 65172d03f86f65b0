"""The completion encoders (surfaces/completions/encode.py) against the OpenAI SDK's own types."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st
from openai.types import Completion

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.completions.encode import InfillStream, TextStream, infill_whole, text_whole


def _frames(data: bytes) -> list:
    return [f[len(b"data: "):] for f in data.split(b"\n\n") if f]


def test_text_stream_chunks_are_completions_to_the_sdk():
    enc = TextStream(id="cmpl-1", created=1, model="m", include_usage=True)
    out = b"".join(enc.feed(e) for e in [c.Usage(3, 1), c.TextDelta("a"), c.TextDelta("b"), c.Usage(3, 2),
                                          c.Finish("length")]) + enc.finish()
    frames = _frames(out)
    assert frames[-1] == b"[DONE]"
    # the SDK reads stream chunks leniently (finish_reason null until the end): construct, as it does
    from openai._models import construct_type
    docs = [construct_type(type_=Completion, value=json.loads(f)) for f in frames[:-1]]
    assert all(d.object == "text_completion" and d.model == "m" and d.id == "cmpl-1" for d in docs)
    assert "".join(d.choices[0].text for d in docs if d.choices) == "ab"
    assert docs[-2].choices[0].finish_reason == "length"
    assert docs[-1].choices == [] and docs[-1].usage.prompt_tokens == 3 and docs[-1].usage.completion_tokens == 2


def test_a_failure_mid_stream_is_an_error_chunk_without_done():
    enc = TextStream(id="i", created=1, model="m", include_usage=False)
    out = enc.feed(c.TextDelta("a")) + enc.feed(c.UpstreamError("boom")) + enc.feed(c.TextDelta("b"))
    assert enc.ended and b"[DONE]" not in out and json.loads(_frames(out)[-1])["error"]["message"].endswith("boom")


def test_whole_answers():
    doc, err = text_whole([c.TextDelta("x"), c.Finish("stop_sequence", "\n"), c.Usage(2, 1)], id="i", created=1, model="m")
    assert err is None and Completion.model_validate(doc).choices[0].finish_reason == "stop"
    assert doc["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    doc, err = infill_whole([c.Usage(5, 1), c.TextDelta("x"), c.Finish("stop_sequence", "\n")], model="m")
    assert doc["content"] == "x" and doc["stop_type"] == "word" and doc["stopping_word"] == "\n"
    assert (doc["tokens_predicted"], doc["tokens_evaluated"]) == (1, 5)
    assert text_whole([c.UpstreamError("no")], id="i", created=1, model="m")[1] == "no"


def test_infill_stream_ends_with_its_stop_object():
    enc = InfillStream(model="m")
    out = enc.feed(c.Usage(4, 1)) + enc.feed(c.TextDelta("a")) + enc.feed(c.Finish("length")) + enc.finish()
    docs = [json.loads(f) for f in _frames(out)]
    assert [d["stop"] for d in docs] == [False, True]
    assert docs[-1]["stop_type"] == "limit" and docs[-1]["tokens_predicted"] == 1 and docs[-1]["model"] == "m"


@given(st.text(), st.text(), st.integers(0, 2**40))
def test_a_streamed_tokens_chunk_is_the_whole_chunk_encoded(text, model, created):
    """The per-token chunk is built from bytes encoded once; it must be what encoding the whole
    chunk would give, whatever the text and the model name hold (quotes, U+2028, newlines)."""
    from homelab_frontend.surfaces.completions.encode import _sse

    enc = TextStream(id="cmpl-1", created=created, model=model, include_usage=False)
    whole = {**enc.head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    assert enc.feed(c.TextDelta(text)) == _sse(whole)
