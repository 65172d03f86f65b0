"""Corners of the request path: how a request is labelled while it runs and when it ends, and
answers from a backend that do not parse."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web

from conftest import QWEN
from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import wait_for


def test_nonstreaming_with_gateway_stop_strings_is_generating(gateway, ollama_stub, stubs):
    """Ollama does not say which stop string fired, so the gateway streams from it and matches
    the strings itself, for a client that asked for one whole message: that request is
    generating (not waiting for a first token) and a client leaving is logged as such."""
    body = {"model": QWEN, "max_tokens": 1024, "stop_sequences": ["never-said"],
            "messages": [{"role": "user", "content": "[stub content=200 delay_ms=20]"}]}
    logged = len(gateway.access_log())
    client = threading.Thread(target=post_and_vanish, args=(gateway.base + "/messages", body),
                              kwargs={"after_s": 1.5})
    client.start()
    try:
        def answering() -> list[str]:  # past admission and the upstream's headers
            phases = [r["phase"] for r in gateway.admin()["requests"] if r["model"] == QWEN]
            return [p for p in phases if p not in ("queued", "connecting")]

        assert wait_for(answering, 5) == ["generating"]
    finally:
        client.join(10)
    wait_for(lambda: ollama_stub.stats()["cancelled"] == 1, 2)
    rec = wait_for(lambda: [r for r in gateway.access_log()[logged:] if r["model"] == QWEN], 2)
    assert [(r["status"], r["outcome"]) for r in rec] == [(499, "cancelled_generating")], rec


# -- a backend whose /tokenize answer is broken ------------------------------------------------


class _BrokenTokenizer:
    """A vLLM-shaped backend, in a thread of its own, whose /tokenize answers a 200 that is not
    JSON, or that breaks off halfway through its body."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.mode == "not_json":
            return web.Response(text="<html>tokenizer busy</html>", content_type="text/html")
        resp = web.StreamResponse(headers={"content-type": "application/json", "content-length": "100"})
        await resp.prepare(request)
        await resp.write(b'{"count": 1')
        request.transport.close()  # fewer bytes than announced: the body breaks off
        return resp

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def __enter__(self) -> "_BrokenTokenizer":
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.parametrize("mode", ["not_json", "cut_short"])
def test_count_tokens_falls_back_to_an_estimate_when_tokenize_breaks(mode):
    with _BrokenTokenizer(mode) as upstream, \
            Gateway(config_for({"b": {"url": upstream.base, "kind": "vllm"}}, {"m": {"backend": "b"}})) as gw:
        status, _, raw = post_raw(gw.base + "/messages/count_tokens",
                                  {"model": "m", "messages": [{"role": "user", "content": "one two three four"}]})
        assert status == 200, raw
        assert b'"input_tokens":' in raw
        assert "Traceback" not in gw.stderr()
