"""surfaces/ollama/handler.py: the Ollama dialect's decisions, without sockets: the model field
(`model`, or an older client's `name`), a model not found in Ollama's words, what a load, an
unload or a `keep_alive` asks of the managed backends (only those), the one answer to a load
request, and the turn's own parts (NDJSON, `think: false` hides reasoning, an upstream failure in
a whole answer)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.lifecycle.keep_alive import FOREVER
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces.ollama import handler
from homelab_frontend.surfaces.ollama.request import parse_chat, parse_generate


def test_the_model_is_model_or_an_older_clients_name_and_required():
    assert handler._model_field({"model": "a", "name": "b"}) == "a"
    assert handler._model_field({"name": "b"}) == "b"
    for raw in ({}, {"model": ""}, {"model": 3}):
        with pytest.raises(GatewayError) as got:
            handler._model_field(raw)
        assert got.value.kind == "invalid_request" and got.value.param == "model"


class _Router:
    def __init__(self, models: list[str], fail: GatewayError | None = None) -> None:
        self.models, self.fail = models, fail

    def model_names(self):
        return self.models

    def resolve(self, name):
        if self.fail is not None:
            raise self.fail
        if name not in self.models:
            raise GatewayError("not_found", f"no model {name}")
        return name


def test_a_model_not_found_is_ollamas_404_listing_the_tagged_names():
    gw = SimpleNamespace(router=_Router(["qwen", "llama:8b"]))
    with pytest.raises(GatewayError) as got:
        handler.resolve(gw, "mistral")
    assert got.value.status == 404 and '"mistral" not found' in got.value.message
    assert "qwen:latest" in got.value.message and "llama:8b" in got.value.message


def test_any_other_routing_error_passes_unchanged():
    err = GatewayError("backend_down", "all down")
    with pytest.raises(GatewayError) as got:
        handler.resolve(SimpleNamespace(router=_Router(["qwen"], fail=err)), "qwen")
    assert got.value is err


class _Fleet:
    def __init__(self, managed: set[str]) -> None:
        self.managed_names = managed
        self.calls: list[tuple] = []

    def managed(self, name):
        return name in self.managed_names

    def keep_alive(self, name, seconds, *, prompt=True):
        self.calls.append(("keep_alive", name, seconds, prompt))

    def want(self, name):
        self.calls.append(("want", name))


def _route(*names):
    return SimpleNamespace(backends=[SimpleNamespace(name=n) for n in names])


@pytest.mark.parametrize("body, expected", [
    (b'{"model": "m"}', [("want", "run")]),  # a load request starts the managed server
    (b'{"model": "m", "keep_alive": "5m"}', [("keep_alive", "run", 300, False), ("want", "run")]),
    (b'{"model": "m", "keep_alive": 0}', [("keep_alive", "run", 0, False)]),  # an unload starts nothing
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', []),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "keep_alive": -1}', [("keep_alive", "run", FOREVER, True)]),
    # 0 with a prompt: answered, then stopped once idle (a TTL of 0), not an unload
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "0s"}', [("keep_alive", "run", 0, True)]),
])
def test_a_clients_word_on_its_models_lifetime_reaches_only_managed_backends(body, expected):
    fleet = _Fleet({"run"})
    handler._lifetime(SimpleNamespace(fleet=fleet), _route("static", "run"), parse_chat(body))
    assert fleet.calls == expected


@pytest.mark.parametrize("parse, body, field", [(parse_chat, b'{"model": "m"}', "message"),
                                                (parse_generate, b'{"model": "m"}', "response")])
def test_a_load_request_is_answered_with_one_done_object(parse, body, field):
    doc = handler._loaded(parse(body))
    assert doc["done"] is True and doc["done_reason"] == "load" and doc["model"] == "m" and field in doc
    unload = handler._loaded(parse(body[:-1] + b', "keep_alive": 0}'))
    assert unload["done_reason"] == "unload"


def _turn(body: bytes):
    async def make():
        return handler.OllamaTurn(parse_chat(body), Tracked("req_ol", "ollama", "m", None, False))
    return asyncio.run(make())


def test_the_turn_streams_ndjson_and_hides_reasoning_only_for_think_false():
    msgs = b'"messages": [{"role": "user", "content": "hi"}]'
    assert handler.OllamaTurn.stream_headers["content-type"] == "application/x-ndjson"
    assert _turn(b'{"model": "m", ' + msgs + b', "think": false}').hide_reasoning
    assert not _turn(b'{"model": "m", ' + msgs + b', "think": true}').hide_reasoning
    assert not _turn(b'{"model": "m", ' + msgs + b'}').hide_reasoning


def test_a_whole_answer_has_the_text_and_an_upstream_failure_is_an_upstream_error():
    turn = _turn(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false}')
    ex = SimpleNamespace(backend=SimpleNamespace(name="b"))
    doc = turn.whole([c.TextDelta("Hello"), c.Finish("stop")], ex)
    assert doc["message"]["content"] == "Hello" and doc["done"] is True
    with pytest.raises(GatewayError) as got:
        turn.whole([c.TextDelta("He"), c.UpstreamError("backend died")], ex)
    assert got.value.kind == "upstream_error" and "'b'" in got.value.message
