"""The backend's own prompt count (upstream/prompt_count.py), against in-process vLLM- and
llama.cpp-flavoured stubs on free loopback ports; None, never an exception, when it cannot say."""

from __future__ import annotations

import asyncio

from homelab_frontend import config as cfgmod
from homelab_frontend.stub.server import StubServer
from homelab_frontend.stub.state import StubConfig
from homelab_frontend.upstream.client import UpstreamClient
from homelab_frontend.upstream.prompt_count import can_count, count_prompt

CHAT = {"model": "up-m", "messages": [{"role": "user", "content": "one two three four five six seven"}]}


def _client(url: str, kind: str) -> UpstreamClient:
    b = cfgmod.parse({"backends": {"u": {"url": url + "/v1", "kind": kind}},
                      "models": {"m": {"backend": "u"}}}).backends["u"]
    return UpstreamClient("u", b)


def _count(flavour: str, kind: str, chat: dict) -> int | None:
    async def main():
        async with StubServer(StubConfig(flavour=flavour, models=("up-m",))) as stub:
            client = _client(stub.url, kind)
            try:
                return await count_prompt(client, kind, chat, timeout_s=5)
            finally:
                await client.close()

    return asyncio.run(main())


def test_which_kinds_count():
    assert can_count("vllm") and can_count("llamacpp")
    assert not can_count("ollama") and not can_count("openai")


def test_vllm_and_llamacpp_count_and_more_text_counts_more():
    for flavour in ("vllm", "llamacpp"):
        short = _count(flavour, flavour, CHAT)
        longer = _count(flavour, flavour, {**CHAT, "messages": CHAT["messages"] * 3})
        assert isinstance(short, int) and short > 0, flavour
        assert longer > short, flavour


def test_no_counter_or_no_backend_is_none():
    assert _count("ollama", "ollama", CHAT) is None

    async def unreachable():
        client = _client("http://127.0.0.1:9", "vllm")  # nothing listens on the discard port
        try:
            return await count_prompt(client, "vllm", CHAT, timeout_s=2)
        finally:
            await client.close()

    assert asyncio.run(unreachable()) is None
