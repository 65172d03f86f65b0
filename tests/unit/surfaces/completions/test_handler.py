"""surfaces/completions/handler.py: the completion surfaces' decisions, without sockets: the
checks before a slot (a vLLM-only field, a suffix no backend can take), which upstream call a
request becomes on which backend (/completions with the FIM template rendered, llama.cpp's
/infill, Ollama's own suffix), a model that cannot fill in the middle as the client's 400, the
bodies sent, the decoder that reads the answer, and whose completion it is for latest-wins."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from homelab_frontend.config import FIM_PRESETS
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.completions import handler
from homelab_frontend.surfaces.completions.request import TextCall
from homelab_frontend.upstream.client import UpstreamFailure
from homelab_frontend.upstream.text_decode import InfillDecoder, TextChunkDecoder

QWEN = FIM_PRESETS["qwen2.5-coder"]


def _route(*kinds: str, fim=None):
    return SimpleNamespace(backends=[SimpleNamespace(cfg=SimpleNamespace(kind=k)) for k in kinds], fim=fim,
                           client_model="coder", model="coder", upstream_model="up/coder", supersede=False)


def _turn(call: TextCall, route) -> handler._OpenAITurn:
    return handler._OpenAITurn(call, SimpleNamespace(route=route))


def _call(**kw) -> TextCall:
    return TextCall(**{"endpoint": "completions", "model": "coder", "stream": False, "prompt": "def f(", **kw})


def test_a_vllm_only_field_for_a_model_with_another_kind_of_backend_is_refused_before_a_slot():
    with pytest.raises(GatewayError) as got:
        _turn(_call(vllm_only="echo"), _route("vllm", "llamacpp")).check()
    assert got.value.param == "echo"
    _turn(_call(vllm_only="echo"), _route("vllm")).check()


@pytest.mark.parametrize("kinds, fim, ok", [(("vllm",), None, False), (("vllm",), QWEN, True),
                                            (("llamacpp",), None, True), (("ollama",), None, True)])
def test_a_suffix_needs_a_fim_template_or_a_backend_that_takes_one(kinds, fim, ok):
    turn = _turn(_call(suffix=")\n"), _route(*kinds, fim=fim))
    if ok:
        turn.check()
    else:
        with pytest.raises(GatewayError) as got:
            turn.check()
        assert got.value.param == "suffix" and "models.coder.fim" in got.value.message


class _Exchange:
    def __init__(self, kind: str, fail_status: int | None = None) -> None:
        self.backend = SimpleNamespace(name="b", cfg=SimpleNamespace(kind=kind))
        self.opened: list[tuple[str, dict, bool]] = []
        self.fail_status = fail_status

    async def attempt(self, fn):
        return await fn()

    async def open(self, path, body, *, stream, root=False):
        self.opened.append((path, json.loads(body), root))
        if self.fail_status is not None:
            raise UpstreamFailure("upstream_error", "Infill is not supported by this model", cause="status",
                                  upstream_status=self.fail_status)
        return object()


def _open(turn: handler.TextTurn, kind: str, fail_status: int | None = None):
    ex = _Exchange(kind, fail_status)
    asyncio.run(turn.open_upstream(ex, stream=True))
    return ex.opened[0]


def test_a_suffix_with_a_fim_template_is_rendered_into_a_completions_prompt():
    turn = _turn(_call(suffix=")\n", params={"max_tokens": 8}), _route("vllm", fim=QWEN))
    path, body, root = _open(turn, "vllm")
    assert path == "/completions" and not root
    assert body["prompt"] == "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>"
    assert body["model"] == "up/coder" and body["max_tokens"] == 8 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}  # vLLM only
    assert isinstance(turn.decoder(), TextChunkDecoder)


def test_a_suffix_to_llamacpp_without_a_template_goes_to_its_infill_with_the_fields_renamed():
    call = _call(suffix=")\n", params={"max_tokens": 8, "temperature": 0.1, "n": 2})
    turn = _turn(call, _route("llamacpp"))
    path, body, root = _open(turn, "llamacpp")
    assert (path, root) == ("/infill", True)
    assert body == {"input_prefix": "def f(", "input_suffix": ")\n", "stream": True, "n_predict": 8, "temperature": 0.1}
    assert isinstance(turn.decoder(), InfillDecoder)


def test_a_suffix_to_ollama_is_sent_as_its_own_suffix_field():
    path, body, root = _open(_turn(_call(suffix=")\n"), _route("ollama")), "ollama")
    assert path == "/completions" and body["prompt"] == "def f(" and body["suffix"] == ")\n"
    assert "continuous_usage_stats" not in body["stream_options"]


def test_a_llamacpp_clients_own_infill_fields_are_relayed_as_sent():
    call = TextCall(endpoint="infill", model="coder", stream=False, prompt="a", suffix="b",
                    llama={"input_prefix": "a", "input_suffix": "b", "n_indent": 4})
    path, body, root = _open(handler._InfillTurn(call, SimpleNamespace(route=_route("llamacpp"))), "llamacpp")
    assert path == "/infill" and body == {"input_prefix": "a", "input_suffix": "b", "n_indent": 4, "stream": True}


def test_a_llamacpp_client_of_a_llamacpp_backend_gets_the_native_relay_and_others_the_rebuilt_shape():
    from homelab_frontend.surfaces.completions.encode import InfillStream
    from homelab_frontend.surfaces.completions.native import NativeDecoder, NativeStream

    call = TextCall(endpoint="completion", model="coder", stream=True, prompt="x", llama={"prompt": "x"},
                    fields=["content"])
    turn = handler._InfillTurn(call, SimpleNamespace(route=_route("llamacpp", "vllm")))
    path, body, root = _open(turn, "llamacpp")
    assert (path, root, body) == ("/completion", True, {"prompt": "x", "stream": True})
    assert isinstance(turn.decoder(), NativeDecoder) and isinstance(turn.encoder(), NativeStream)
    path, body, _ = _open(turn, "vllm")  # the same request failed over to another kind
    assert path == "/completions" and body["prompt"] == "x"
    assert isinstance(turn.decoder(), TextChunkDecoder) and isinstance(turn.encoder(), InfillStream)


def test_a_warmup_to_an_openai_shaped_backend_asks_one_token_not_zero():
    call = TextCall(endpoint="infill", model="coder", stream=False, prompt="a", params={"max_tokens": 0}, warmup=True)
    _, body, _ = _open(handler._InfillTurn(call, SimpleNamespace(route=_route("vllm"))), "vllm")
    assert body["max_tokens"] == 1


def test_a_model_llamacpp_cannot_infill_is_the_clients_400_naming_the_suffix_field():
    call = TextCall(endpoint="infill", model="coder", stream=False, prompt="a", suffix="b")
    turn = handler._InfillTurn(call, SimpleNamespace(route=_route("llamacpp")))
    with pytest.raises(GatewayError) as got:
        _open(turn, "llamacpp", fail_status=501)
    assert got.value.status == 400 and got.value.param == "input_suffix"
    with pytest.raises(UpstreamFailure):  # any other refusal is the backend's, as it was
        _open(turn, "llamacpp", fail_status=500)


def test_a_vllm_only_field_on_a_backend_of_another_kind_is_refused_at_the_call():
    with pytest.raises(GatewayError) as got:
        _open(_turn(_call(vllm_only="echo"), _route("vllm", "ollama")), "ollama")
    assert got.value.param == "echo" and "'b'" in got.value.message


def test_a_completion_belongs_to_its_key_and_its_address_together():
    def client(name, addr):
        return handler.client_of(SimpleNamespace(client=addr), SimpleNamespace(principal=SimpleNamespace(name=name)))

    assert client("alice", "10.0.0.7") == "alice@10.0.0.7"
    assert client(None, "10.0.0.7") == "@10.0.0.7"
    # one key shared from two machines, or two people without keys: never one client
    assert client("alice", "10.0.0.7") != client("alice", "10.0.0.8")
    assert client(None, "10.0.0.7") != client(None, "10.0.0.8")
    assert client("alice", "10.0.0.7") != client("bob", "10.0.0.7")


def test_an_infill_with_extra_chunks_no_backend_can_take_is_refused_before_a_slot():
    call = TextCall(endpoint="infill", model="coder", stream=False, prompt="a", suffix="b",
                    extra=[{"filename": "x.py", "text": "import os\n"}])
    turn = handler._InfillTurn(call, SimpleNamespace(route=_route("ollama")))
    with pytest.raises(GatewayError):  # what _open would say, but before admission
        _open(turn, "ollama")
    with pytest.raises(GatewayError):
        turn.check()
