"""llama.cpp's own /infill and /completion objects relayed (surfaces/completions/native.py): the
partial objects byte for byte, the last one trimmed by `response_fields` as llama.cpp trims it
(server-common.cpp `json_get_nested_values`), a whole answer rebuilt as llama.cpp gives a plain
request."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.completions.encode import infill_error
from homelab_frontend.surfaces.completions.native import NativeDecoder, NativeStream, native_whole, nested_values

LLAMA_VIM = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
             "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
             "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
TIMINGS = {"cache_n": 3, "prompt_n": 6, "prompt_ms": 12.5, "prompt_per_token_ms": 2.1, "prompt_per_second": 480.0,
           "predicted_n": 2, "predicted_ms": 30.0, "predicted_per_token_ms": 15.0, "predicted_per_second": 66.7}


def j(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def partial(text: str, n: int, **more) -> bytes:
    return j({"index": 0, "content": text, "tokens": [100 + n], "stop": False, "id_slot": 0,
              "tokens_predicted": n, "tokens_evaluated": 9, **more})


def last(content: str = "", **more) -> dict:
    return {"index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": "gemma",
            "tokens_predicted": 2, "tokens_evaluated": 9,
            "generation_settings": {"n_predict": 8, "stream": True, "temperature": 0.0},
            "prompt": "<fim_pre>a<fim_suf>b<fim_mid>", "has_new_line": False, "truncated": False,
            "stop_type": "limit", "stopping_word": "", "tokens_cached": 11, "timings": TIMINGS, **more}


def test_nested_values_is_llamacpps_flattening():
    doc = last()
    got = nested_values(LLAMA_VIM, doc)
    assert got == {"content": "", "truncated": False, "tokens_cached": 11,
                   **{f"timings/{k}": v for k, v in TIMINGS.items() if k != "cache_n"}}
    assert list(got) == LLAMA_VIM  # in the order asked
    assert nested_values([""], doc) == {}  # llama.vim's warm-up
    assert nested_values(["nope", "timings/nope", "content/x", "generation_settings/n_predict"], doc) == {
        "generation_settings/n_predict": 8}
    assert nested_values(["timings"], doc) == {"timings": TIMINGS}


@given(st.lists(st.sampled_from(["content", "stop", "timings", "timings/prompt_n", "a", "", "tokens_cached"])))
def test_nested_values_keeps_only_paths_that_name_something(paths):
    got = nested_values(paths, last())
    assert set(got) == {p for p in paths if p in ("content", "stop", "timings", "timings/prompt_n", "tokens_cached")}


def _stream(payloads: list[bytes], fields):
    d = NativeDecoder(whole=False)
    enc = NativeStream(d, fields, infill_error, model="coder")
    out = b""
    events: list[c.Event] = []
    for p in payloads:
        got = d.feed(p)
        events += got
        for ev in got:
            out += enc.feed(ev)
    return d, enc, out, events


def test_a_stream_is_relayed_as_llamacpp_wrote_it_and_the_last_object_trimmed():
    p1, p2 = partial(" x", 1), partial(" y", 2, timings=TIMINGS)
    d, enc, out, events = _stream([p1, p2, j(last())], LLAMA_VIM)
    assert d.done and events[-1] == c.Finish("length") and c.Usage(9, 2, 3) in events
    out += enc.finish()
    frames = out.split(b"\n\n")
    assert frames[0] == b"data: " + p1 and frames[1] == b"data: " + p2  # byte for byte
    tail = json.loads(frames[2].removeprefix(b"data: "))
    assert tail == nested_values(LLAMA_VIM, last()) and "stop" not in tail
    assert frames[3:] == [b""]  # nothing after it: llama.cpp sends no [DONE] here
    # no fields asked: the whole last object
    _, enc, out, _ = _stream([p1, j(last())], None)
    # the model the client asked for, the backend's own name stays behind the gateway
    assert json.loads((out + enc.finish()).split(b"\n\n")[1].removeprefix(b"data: ")) == {**last(), "model": "coder"}


def test_an_upstream_error_object_is_relayed_as_it_came():
    err = j({"error": {"code": 500, "message": "boom", "type": "server_error"}})
    _, enc, out, events = _stream([partial(" x", 1), err], None)
    assert isinstance(events[-1], c.UpstreamError) and enc.ended
    assert out.split(b"\n\n")[1] == b"data: " + err
    _, enc, out, _ = _stream([b"{not json"], None)
    assert json.loads(out.removeprefix(b"data: "))["error"]["code"] == 500


def test_the_gateways_own_failure_is_in_llamacpps_error_shape():
    d = NativeDecoder(whole=False)
    enc = NativeStream(d, None, infill_error, model="gemma")
    d.feed(partial(" x", 1))
    out = enc.fail("timeout", "no token for 30 s")
    frames = out.split(b"\n\n")
    assert frames[0] == b"data: " + partial(" x", 1)
    assert json.loads(frames[1].removeprefix(b"data: ")) == {
        "error": {"code": 504, "message": "no token for 30 s", "type": "server_error"}}


def test_a_whole_answer_is_llamacpps_plain_answer():
    probs = [{"id": 101, "token": " x", "bytes": [32, 120], "logprob": -0.1, "top_logprobs": []}]
    d = NativeDecoder(whole=True)
    for p in (partial(" x", 1, completion_probabilities=probs), partial(" y", 2), j(last())):
        d.feed(p)
    assert d.take() == []  # nothing to stream
    doc = json.loads(msgspec.json.encode(native_whole(d, None, model="gemma", return_tokens=False)))  # as it goes out
    assert doc["content"] == " x y" and doc["tokens"] == [] and doc["generation_settings"]["stream"] is False
    assert doc["completion_probabilities"] == probs and doc["timings"] == TIMINGS and doc["tokens_cached"] == 11
    assert native_whole(d, None, model="gemma", return_tokens=True)["tokens"] == [101, 102]
    assert native_whole(d, LLAMA_VIM, model="gemma", return_tokens=False) == {
        "content": " x y", "truncated": False, "tokens_cached": 11,
        **{f"timings/{k}": v for k, v in TIMINGS.items() if k != "cache_n"}}
    # llama.vim's check before it decodes: `"content"\s*:"`
    assert b'"content":"' in json.dumps(native_whole(d, LLAMA_VIM, model="gemma", return_tokens=False), separators=(",", ":")).encode()


def test_progress_objects_are_relayed_in_a_stream_and_left_out_of_a_whole_answer():
    progress = j({"index": 0, "content": "", "tokens": [-1], "stop": False, "id_slot": 0, "tokens_predicted": 0,
                  "tokens_evaluated": 9, "prompt_progress": {"total": 9, "cache": 0, "processed": 9, "time_ms": 3}})
    _, enc, out, _ = _stream([progress, partial(" x", 1), j(last())], None)
    assert out.split(b"\n\n")[0] == b"data: " + progress
    d = NativeDecoder(whole=True)
    for p in (progress, partial(" x", 1), j(last())):
        d.feed(p)
    assert native_whole(d, None, model="gemma", return_tokens=True)["tokens"] == [101]


def test_a_malformed_piece_is_an_upstream_error_not_a_crash():
    d = NativeDecoder(whole=True)
    got = d.feed(j({"content": "x", "stop": False, "tokens": ["not an id"]}))
    assert isinstance(got[-1], c.UpstreamError) and "tokens" in got[-1].message
    assert d.feed(j(last())) == []  # nothing after a failure


def test_the_warm_up_is_answered_with_an_empty_object():
    d = NativeDecoder(whole=True)
    d.feed(j(last(tokens_predicted=0, stop_type="limit")))
    assert d.done and native_whole(d, [""], model="gemma", return_tokens=False) == {}
