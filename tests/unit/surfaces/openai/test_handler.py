"""surfaces/openai/handler.py: the Chat Completions relay's decisions, without sockets (a fake
upstream client and exchange): a whole answer checked (its counts into the record, a bad body a
GatewayError of its kind), a whole answer folded from an upstream stream (a stream broken off
fails over), and the relay of a stream: the model renamed, usage-only chunks only for a client
that asked, a malformed or failed chunk ending the stream with an error chunk, `[DONE]` only
after the upstream's own."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces.model_rewrite import ModelRewriter
from homelab_frontend.surfaces.openai import handler
from homelab_frontend.upstream.client import UpstreamFailure


def _chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None,
           choices: bool = True, model: str = "up-model") -> bytes:
    doc: dict = {"object": "chat.completion.chunk", "model": model,
                 "choices": [{"index": 0, "delta": {} if content is None else {"content": content},
                              "finish_reason": finish}] if choices else []}
    if usage is not None:
        doc["usage"] = usage
    return json.dumps(doc, separators=(",", ":")).encode()


class _Client:
    def __init__(self, batches: list[list[bytes]]) -> None:
        self.batches = batches

    async def sse(self, upstream):
        for batch in self.batches:
            yield batch


class _Exchange:
    def __init__(self, batches: list[list[bytes]]) -> None:
        self.t = Tracked("req_o", "openai", "m", None, True)
        self.t.connecting()  # the slot held, as request.exchange has it before the upstream is asked
        self.client = _Client(batches)
        self.backend = SimpleNamespace(name="b")
        self.progress = 0
        self.complete = False
        self.firsts = 0

    def first_token(self) -> None:
        self.firsts += 1

    async def send(self, out, data: bytes) -> None:
        await out.write(data)

    def own_cancel(self):
        return None


class _Out:
    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False

    async def write(self, data: bytes) -> None:
        self.data += data

    async def write_eof(self) -> None:
        self.eof = True


def test_an_error_chunk_is_one_sse_event_in_openais_error_shape():
    data = handler.error_chunk("it broke", "timeout_error")
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    assert json.loads(data[6:]) == {"error": {"message": "it broke", "type": "timeout_error", "param": None, "code": None}}


def _in_loop(fn):
    async def main():
        return fn()
    return asyncio.run(main())


def test_a_whole_completions_counts_go_into_the_record():
    body = json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                       "content": "hi"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}).encode()

    def go():
        ex = _Exchange([])
        handler._checked_completion(body, ex, ex.t)
        return ex.t

    t = _in_loop(go)
    assert (t.tokens_in, t.tokens_out) == (9, 2)


def test_a_whole_completion_leaves_a_count_it_does_not_report_as_it_was():
    # the one usage rule (surfaces/usage.py UsageFold.add): a count left out keeps its value,
    # where this path used to write None and 0 over it
    body = json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                       "content": "hi"}, "finish_reason": "stop"}],
                       "usage": {"completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}}).encode()

    def go():
        ex = _Exchange([])
        ex.t.tokens_in = 7  # known before the answer (a tokenizer's count)
        handler._checked_completion(body, ex, ex.t)
        return ex.t

    t = _in_loop(go)
    assert (t.tokens_in, t.tokens_out, t.tokens_cached) == (7, 2, 3)


@pytest.mark.parametrize("body, kind", [(b"<html>", "upstream_malformed"),
                                        (b'{"error": {"message": "no such model"}}', "upstream_error")])
def test_a_bad_whole_body_is_a_gateway_error_of_its_kind(body, kind):
    def go():
        ex = _Exchange([])
        handler._checked_completion(body, ex, ex.t)

    with pytest.raises(GatewayError) as got:
        _in_loop(go)
    assert got.value.kind == kind and "'b'" in got.value.message


def _whole(batches, monkeypatch):
    async def open_chat(ex, req, **kw):
        assert kw["stream"] is True
        return object()

    monkeypatch.setattr(handler, "open_chat", open_chat)

    async def main():
        ex = _Exchange(batches)
        raw = await handler._whole_from_stream(ex, None, ex.t, False)
        return ex, json.loads(raw)

    return asyncio.run(main())


def test_a_whole_answer_folded_from_a_stream_is_one_completion_with_the_upstreams_counts(monkeypatch):
    ex, doc = _whole([[_chunk("Hel"), _chunk("lo")], [_chunk(None, "stop")],
                      [_chunk(choices=False, usage={"prompt_tokens": 4, "completion_tokens": 2}), b"[DONE]"]],
                     monkeypatch)
    assert doc["choices"][0]["message"]["content"] == "Hello"
    assert (ex.t.tokens_in, ex.t.tokens_out) == (4, 2) and ex.complete


def test_a_whole_answer_folded_from_a_stream_records_the_cached_count_as_a_stream_does(monkeypatch):
    usage = {"prompt_tokens": 4, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}
    ex, doc = _whole([[_chunk("Hi"), _chunk(None, "stop")], [_chunk(choices=False, usage=usage), b"[DONE]"]],
                     monkeypatch)
    assert (ex.t.tokens_in, ex.t.tokens_out, ex.t.tokens_cached) == (4, 2, 3)
    assert doc["usage"] == usage  # the client gets the usage as the upstream sent it


def test_without_the_upstreams_counts_the_pieces_are_counted(monkeypatch):
    ex, doc = _whole([[_chunk("a"), _chunk("b"), _chunk("c")], [_chunk(None, "stop"), b"[DONE]"]], monkeypatch)
    assert (ex.t.tokens_in, ex.t.tokens_out) == (None, 3)


def test_a_stream_without_done_fails_over_and_an_error_chunk_is_the_backends_failure(monkeypatch):
    with pytest.raises(UpstreamFailure) as broke:
        _whole([[_chunk("Hel")]], monkeypatch)
    assert broke.value.cause == "broke"
    with pytest.raises(GatewayError) as failed:
        _whole([[_chunk("Hel"), b'{"error": {"message": "out of memory"}}']], monkeypatch)
    assert failed.value.kind == "upstream_error" and "out of memory" in failed.value.message


def _relay(batches, wants_usage: bool = False):
    async def main():
        ex = _Exchange(batches)
        out = _Out()
        await handler._relay(None, object(), out, ex, ex.t, ModelRewriter("up-model", "client-model"), wants_usage)
        return ex, out

    return asyncio.run(main())


def _events(data: bytes) -> list[bytes]:
    return [e[6:] for e in bytes(data).split(b"\n\n") if e]


def test_the_relay_renames_the_model_and_ends_with_done_after_the_upstreams():
    ex, out = _relay([[_chunk("Hel")], [_chunk("lo"), _chunk(None, "stop")], [b"[DONE]"]])
    events = _events(out.data)
    assert events[-1] == b"[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert {d["model"] for d in docs} == {"client-model"}
    assert ex.t.tokens_out == 2 and ex.firsts == 1 and ex.t.outcome == "ok" and out.eof


@pytest.mark.parametrize("wants", [False, True])
def test_a_usage_only_chunk_reaches_only_a_client_that_asked_for_usage(wants):
    usage = _chunk(choices=False, usage={"prompt_tokens": 3, "completion_tokens": 1})
    ex, out = _relay([[_chunk("a")], [_chunk(None, "stop"), usage, b"[DONE]"]], wants_usage=wants)
    with_usage = [e for e in _events(out.data) if e != b"[DONE]" and "usage" in json.loads(e)]
    assert bool(with_usage) is wants
    assert ex.t.tokens_in == 3  # the record has the counts either way


@pytest.mark.parametrize("bad, said", [(b"{not json", "malformed chunk"),
                                       (b'{"error": {"message": "CUDA out of memory"}}', "CUDA out of memory"),
                                       (None, "without finishing")])
def test_a_stream_that_goes_wrong_ends_with_an_error_chunk_and_no_done(bad, said):
    batches = [[_chunk("a")]] + ([[bad, _chunk("never")]] if bad is not None else [])
    ex, out = _relay(batches)
    events = _events(out.data)
    assert b"[DONE]" not in events and b"never" not in bytes(out.data)
    assert said in json.loads(events[-1])["error"]["message"]
    assert ex.t.outcome == "error_upstream_midstream"
