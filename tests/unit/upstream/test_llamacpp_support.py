"""Pure pieces of the llama.cpp support: kind detection, the context refusal, the chunk-stream
assembler, stale-connection classification. (Its context lengths: tests/unit/ops/test_health.py.)"""

from __future__ import annotations

import json

import aiohttp
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.models_answers import LLAMA_MODELS, OLLAMA_MODELS, OPENAI_MODELS, VLLM_MODELS

from homelab_frontend.upstream import backend_kind
from homelab_frontend.request.context_clamp import context_refusal
from homelab_frontend.config import Backend, parse
from homelab_frontend.surfaces.openai.assemble import CompletionAssembler
from homelab_frontend.upstream.client import _stale


def test_kind_detection():
    assert backend_kind.detect(LLAMA_MODELS) == "llamacpp"
    assert backend_kind.detect(VLLM_MODELS) == "vllm"
    assert backend_kind.detect(OLLAMA_MODELS) == "ollama"
    assert backend_kind.detect({"object": "list", "data": [{"id": "bob/x:7b", "owned_by": "bob"}]}) == "ollama"
    assert backend_kind.detect(OPENAI_MODELS) == "openai"
    assert backend_kind.detect({"detail": "nope"}) is None
    assert backend_kind.detect([1, 2]) is None


def test_explicit_kind_wins_and_unset_is_vllm_until_detected():
    cfg = parse({"backends": {"a": {"url": "http://h/v1"}, "b": {"url": "http://h/v1", "kind": "ollama"}}})
    assert cfg.backends["a"].kind is None
    assert backend_kind.effective(cfg.backends["a"], None).kind == "vllm"
    assert backend_kind.effective(cfg.backends["a"], "llamacpp").kind == "llamacpp"
    assert backend_kind.effective(cfg.backends["b"], "llamacpp").kind == "ollama"


def test_only_llamacpp_streams_plain_answers_upstream():
    assert Backend(url="http://h/v1", kind="llamacpp").streams_upstream
    assert not any(Backend(url="http://h/v1", kind=k).streams_upstream for k in ("vllm", "ollama", "openai"))


def test_context_refusal_llama_cpp_wording():
    msg = ("backend 'llama' answered 400: request (1209 tokens) exceeds the available context size "
           "(1024 tokens), try increasing it")
    assert context_refusal(msg) == (1024, 1209)


def _chunk(delta=None, finish=None, usage=None, choices=True) -> bytes:
    doc = {"id": "chatcmpl-1", "created": 7, "model": "up", "system_fingerprint": "b0",
           "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []}
    if usage:
        doc["usage"] = usage
    return json.dumps(doc).encode()


@given(st.lists(st.text(min_size=1, max_size=5), max_size=20))
def test_assembler_joins_any_split_of_the_content(parts):
    asm = CompletionAssembler()
    asm.feed(_chunk({"role": "assistant", "content": None}))  # llama.cpp's first chunk
    for p in parts:
        asm.feed(_chunk({"content": p}))
    asm.feed(_chunk({}, finish="length"))
    asm.feed(_chunk(choices=False, usage={"prompt_tokens": 3, "completion_tokens": len(parts)}))
    out = asm.result()
    assert out["choices"][0]["message"]["content"] == ("".join(parts) or None)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == len(parts) == asm.pieces
    assert (out["id"], out["created"], out["model"], out["object"]) == ("chatcmpl-1", 7, "up", "chat.completion")


def test_assembler_tool_calls_and_reasoning():
    asm = CompletionAssembler()
    asm.feed(_chunk({"reasoning_content": "think"}))
    asm.feed(_chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                     "function": {"name": "get", "arguments": "{\"a\""}}]}))
    asm.feed(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}))
    asm.feed(_chunk({}, finish="tool_calls"))
    msg = asm.result()["choices"][0]["message"]
    assert msg["reasoning_content"] == "think" and msg["content"] is None
    assert msg["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}]


def test_assembler_rejects_a_non_chunk_and_keeps_an_error():
    asm = CompletionAssembler()
    try:
        asm.feed(b"{not json")
    except ValueError as err:
        assert "malformed" in str(err)
    else:
        raise AssertionError("no error")
    asm.feed(b'{"error":{"message":"boom"}}')
    assert asm.error == "boom"
    msgspec.json.encode(asm.result())
    for bad in (b'{"choices": null}', b'{"object": "thing"}', b'{"choices": [{"delta": "x"}]}'):
        with pytest.raises(ValueError):  # what decode calls malformed, the assembler refuses too
            CompletionAssembler().feed(bad)


def test_assembler_reads_chunks_as_the_one_decoder_does():
    # the quirks the decoder settles (upstream/decode.py) are settled the same way here
    asm = CompletionAssembler()
    asm.feed(_chunk({"reasoning": "r", "reasoning_content": "r"}))  # both names: the text once
    asm.feed(_chunk({"tool_calls": [{"id": "c1", "function": {"name": "get", "arguments": {"a": 1}}}]}))  # no index
    asm.feed(_chunk({"tool_calls": [{"function": {"arguments": ""}}]}))  # continues the last call
    asm.feed(_chunk({}, finish="function_call"))
    asm.feed(_chunk(choices=False, usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                          "prompt_tokens_details": {"cached_tokens": 1}}))
    out = asm.result()
    msg = out["choices"][0]["message"]
    assert msg["reasoning_content"] == "r"
    assert msg["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                            "prompt_tokens_details": {"cached_tokens": 1}}  # as sent, every field
    aborted = CompletionAssembler()
    aborted.feed(_chunk({"content": "x"}, finish="abort"))
    assert aborted.error and "abort" in aborted.error


def test_stale_connection_failures():
    assert _stale(aiohttp.ServerDisconnectedError())
    assert _stale(aiohttp.ClientOSError(None, "Can not write request body"))
    assert _stale(aiohttp.ClientOSError(104, "reset"))
    assert not _stale(aiohttp.ServerDisconnectedError(message=object()))  # part of an answer was read
    assert not _stale(aiohttp.ClientOSError(111, "refused"))
    assert not _stale(TimeoutError())


def test_the_connector_tells_a_reused_connection_from_a_new_one():
    import asyncio

    from aiohttp import web

    from homelab_frontend import config as cfgmod
    from homelab_frontend.upstream import client as clientmod

    async def empty(_request):
        return web.json_response({})

    async def main():
        app = web.Application()
        app.router.add_post("/v1/x", empty)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        b = cfgmod.parse({"backends": {"u": {"url": f"http://127.0.0.1:{port}/v1"}},
                          "models": {"m": {"backend": "u"}}}).backends["u"]
        up = clientmod.UpstreamClient("u", b)
        seen = []
        try:
            for _ in range(3):
                resp = await up._request("POST", f"http://127.0.0.1:{port}/v1/x", data=b"{}")
                await resp.read()
                resp.release()
                seen.append(clientmod._reused.get())
        finally:
            await up.close()
            await runner.cleanup()
        return seen

    assert asyncio.run(main()) == [False, True, True]
