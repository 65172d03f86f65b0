"""The stand-in upstreams' flavours (stub/vllm.py, ollama.py, llamacpp.py via stub/chat.py): each
one's stream, as a real client reads it over a loopback socket, is something the gateway's one
decoder accepts and turns into the scripted answer; each one's model-not-found and context
refusals come in its own server's shape."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from homelab_frontend import canonical as c
from homelab_frontend.stub import chat as stub_chat
from homelab_frontend.stub.flavour import Flavour
from homelab_frontend.stub.llamacpp import LlamaCpp
from homelab_frontend.stub.ollama import Ollama
from homelab_frontend.stub.server import FLAVOURS, StubServer
from homelab_frontend.stub.state import StubConfig
from homelab_frontend.stub.vllm import Vllm
from homelab_frontend.upstream.decode import ChunkDecoder

ALL = ("vllm", "ollama", "llamacpp")


def test_the_registry():
    assert {k: FLAVOURS[k] for k in ALL} == {"vllm": Vllm, "ollama": Ollama, "llamacpp": LlamaCpp}
    assert set(FLAVOURS) - set(ALL) == {"whispercpp", "speaches", "kokoro", "sdcpp"}  # tests/unit/stub/test_media.py
    assert all(issubclass(f, Flavour) for f in FLAVOURS.values())
    assert stub_chat.handle_chat is not None


def _post(flavour: str, body: dict) -> tuple[int, list[bytes] | dict, dict]:
    async def main():
        async with StubServer(StubConfig(flavour=flavour, models=("up-m",), max_model_len=64)) as stub:
            async with aiohttp.ClientSession() as http:
                async with http.post(stub.url + "/v1/chat/completions", json=body) as r:
                    if r.content_type == "text/event-stream":
                        payloads = [ln[6:].rstrip(b"\r\n") for ln in (await r.read()).split(b"\n")
                                    if ln.startswith(b"data: ")]
                        return r.status, payloads, stub.state.stats.as_dict()
                    return r.status, await r.json(content_type=None), stub.state.stats.as_dict()

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", ALL)
def test_a_stream_decodes_to_the_scripted_answer(flavour):
    status, payloads, stats = _post(flavour, {
        "model": "up-m", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "[stub content=5]"}]})
    assert status == 200 and payloads[-1] == b"[DONE]"
    dec = ChunkDecoder()
    events = [ev for p in payloads[:-1] for ev in dec.feed(p)]
    text = [ev for ev in events if isinstance(ev, c.TextDelta)]
    finish = [ev for ev in events if isinstance(ev, c.Finish)]
    assert len(text) == 5 and len(finish) == 1 and finish[0].reason == "stop"
    assert stats["completed"] == 1


@pytest.mark.parametrize("flavour", ("vllm", "ollama"))
def test_unknown_model_is_refused_in_the_servers_own_shape(flavour):
    status, body, _ = _post(flavour, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and "nope" in repr(body), (status, body)


def test_llamacpp_serves_its_one_model_whatever_the_name():
    # llama-server ignores `model`: it runs the one model it loaded
    status, body, _ = _post("llamacpp", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and body["choices"][0]["message"]["content"]


def test_vllm_fits_max_tokens_to_the_room_the_prompt_leaves():
    """As vLLM 0.32: prompt + max_tokens over the context is fitted, not refused (5 prompt tokens
    of 64: 59 to generate); more than the whole context, or less than 1, is refused."""
    hi = [{"role": "user", "content": "hi [stub content=100]"}]
    status, body, _ = _post("vllm", {"model": "up-m", "max_tokens": 60, "messages": hi})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
    assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 64
    status, body, _ = _post("vllm", {"model": "up-m", "max_tokens": 10_000, "messages": hi})
    assert status == 400 and body["error"]["param"] == "max_tokens", body
    assert body["error"]["message"].startswith("max_tokens=10000 cannot be greater than max_model_len=64.")
    status, body, _ = _post("vllm", {"model": "up-m", "max_completion_tokens": 0, "messages": hi})
    assert status == 400 and body["error"]["message"].startswith("max_tokens must be at least 1, got 0."), body
    status, body, _ = _post("vllm", {"model": "up-m", "messages": [{"role": "user", "content": "w " * 60}]})
    assert status == 400 and body["error"]["message"].startswith("max_tokens must be at least 1, got 0."), body
    status, body, _ = _post("vllm", {"model": "up-m", "messages": [{"role": "user", "content": "w " * 61}]})
    assert status == 400 and body["error"]["param"] == "input_tokens", body
    assert "your prompt contains at least 65 input tokens" in body["error"]["message"]


def test_vllm_legacy_context_errors_refuse_what_0_32_fits():
    async def main():
        config = StubConfig(models=("up-m",), max_model_len=64, legacy_context_errors=True)
        async with StubServer(config) as stub, aiohttp.ClientSession() as http:
            body = {"model": "up-m", "max_tokens": 60, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(stub.url + "/v1/chat/completions", json=body) as r:
                return r.status, await r.json()

    status, body = asyncio.run(main())
    assert status == 400 and body["error"]["message"].startswith("'max_tokens' or 'max_completion_tokens' is too large")
