"""What a backend says its model can do (upstream/capabilities.py): Ollama's /api/show and
llama.cpp's /props read (pure), and fetched from a real aiohttp server on 127.0.0.1, where a kind
that cannot tell, or a backend that fails, gives None."""

from __future__ import annotations

import asyncio

from aiohttp import web

from support.local_http import serve

from homelab_frontend.config import Backend
from homelab_frontend.upstream.capabilities import can_tell, fetch_facts, parse_llamacpp_props, parse_ollama_show
from homelab_frontend.upstream.client import UpstreamClient


def test_parse_ollama_show_and_llamacpp_props():
    show = {"capabilities": ["completion", "vision", 3], "model_info": {"general.architecture": "gemma3",
            "gemma3.context_length": 131072}, "details": {"family": "gemma3"}, "template": "t"}
    f = parse_ollama_show(show)
    assert f.capabilities == ("completion", "vision") and f.context_length == 131072 and f.template == "t"
    assert parse_ollama_show({"error": "model 'x' not found"}) is None and parse_ollama_show([]) is None
    props = {"default_generation_settings": {"n_ctx": 4096}, "modalities": {"vision": False},
             "chat_template_caps": {"supports_tool_calls": True, "supports_system_role": True}}
    f = parse_llamacpp_props(props)
    assert f.capabilities == ("completion", "tools") and f.context_length == 4096
    f = parse_llamacpp_props({"modalities": {"vision": True}})
    assert f.capabilities == ("completion", "vision")  # tools only when the template says so
    f = parse_llamacpp_props({"chat_template_caps": {"supports_tools": True, "supports_tool_calls": False,
                                                     "supports_reasoning_effort": True}})
    assert f.capabilities == ("completion", "thinking")  # a tools list it cannot answer is no tool calling
    assert parse_llamacpp_props({"chat_template_caps": {"supports_tools": True}}).capabilities == ("completion", "tools")
    assert "thinking" in parse_llamacpp_props({"chat_template_caps": {"supports_preserve_reasoning": True}}).capabilities
    assert parse_llamacpp_props("nope") is None



def fetch(routes: list[web.RouteDef], kind: str | None, timeout_s: float = 5.0):
    async def main():
        async with serve(*routes) as url:
            client = UpstreamClient("b", Backend(url=url, kind=kind))
            try:
                return await fetch_facts(client, kind, "qwen3:8b", timeout_s)
            finally:
                await client.close()

    return asyncio.run(main())


def test_ollama_is_asked_at_its_root_for_the_model():
    asked = []

    async def show(request: web.Request) -> web.Response:
        asked.append(await request.json())
        return web.json_response({"capabilities": ["completion", "tools"], "details": {"family": "qwen3"},
                                  "model_info": {"general.architecture": "qwen3", "qwen3.context_length": 40960}})

    f = fetch([web.post("/api/show", show)], "ollama")
    assert asked == [{"model": "qwen3:8b"}]
    assert f.capabilities == ("completion", "tools") and f.context_length == 40960 and f.details == {"family": "qwen3"}


def test_llamacpp_is_read_off_its_props():
    async def props(request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": 2048},
                                  "chat_template_caps": {"supports_tool_calls": True}})

    f = fetch([web.get("/props", props)], "llamacpp")
    assert f.capabilities == ("completion", "tools") and f.context_length == 2048


def test_a_kind_that_cannot_tell_is_never_asked():
    asked = []

    async def anything(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"capabilities": ["completion"]})

    assert not can_tell("vllm") and not can_tell(None) and can_tell("ollama") and can_tell("llamacpp")
    for kind in ("vllm", "openai", None):
        assert fetch([web.route("*", "/{tail:.*}", anything)], kind) is None
    assert asked == []


def test_a_failing_garbled_or_slow_backend_gives_none():
    async def missing(request: web.Request) -> web.Response:
        return web.json_response({"error": "model 'qwen3:8b' not found"}, status=404)

    async def garbled(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    assert fetch([web.post("/api/show", missing)], "ollama") is None
    assert fetch([web.get("/props", garbled)], "llamacpp") is None
    assert fetch([web.get("/props", slow)], "llamacpp", timeout_s=0.2) is None
