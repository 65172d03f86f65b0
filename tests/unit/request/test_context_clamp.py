"""The context clamp (request/context_clamp.py) over a real aiohttp upstream on a free loopback
port: nothing counted when a high estimate leaves room, the backend's tokenizer count where it has
one, the low estimate where it has none (image data left out), the refusal parsed in every
wording and retried once with exactly what fits, and "no room" as the client's error."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from homelab_frontend import canonical as c
from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.routing import BackendState, Route
from homelab_frontend.request.context_clamp import context_refusal, open_chat
from homelab_frontend.request.exchange import Exchange
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.upstream.client import UpstreamClient

CTX = 4096


def test_every_wording_of_the_refusal_is_parsed_as_context_and_prompt():
    # vLLM before 0.10, after, 0.32's "at least", and llama.cpp's (its numbers the other way round)
    assert context_refusal("This model's maximum context length is 4096 tokens. However, you requested "
                           "5000 tokens (4000 in the messages, 1000 in the completion).") == (4096, 4000)
    assert context_refusal("This model's maximum context length is 4096 tokens and your request has "
                           "4100 input tokens (1000 > 4096 - 4100).") == (4096, 4100)
    assert context_refusal("maximum context length is 1024 tokens. However, your prompt contains at "
                           "least 1025 input tokens") == (1024, 1025)
    assert context_refusal("maximum context length is 1024 tokens; the prompt contains 900 input tokens") == (1024, 900)
    assert context_refusal("request (5000 tokens) exceeds the available context size (4096 tokens), "
                           "try increasing it") == (4096, 5000)
    assert context_refusal("temperature must be at most 2") is None


class Upstream:
    """Records each chat body; refuses one whose prompt + max_tokens exceeds `refuse_prompt`'s
    room with vLLM's wording; /tokenize answers `count` (vLLM's shape)."""

    def __init__(self, count: int | None = None, refuse_prompt: int | None = None, refusal: str | None = None):
        self.count = count
        self.refuse_prompt = refuse_prompt
        self.refusal = refusal
        self.chats: list[dict] = []
        self.tokenized = 0

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chats.append(body)
        if self.refusal is not None:
            return web.json_response({"error": {"message": self.refusal, "type": "BadRequestError"}}, status=400)
        if self.refuse_prompt is not None and body["max_tokens"] > CTX - self.refuse_prompt:
            msg = (f"This model's maximum context length is {CTX} tokens. However, your request has "
                   f"{self.refuse_prompt} input tokens. Please reduce the length of the input messages.")
            return web.json_response({"error": {"message": msg, "type": "BadRequestError"}}, status=400)
        return web.json_response({"id": "x", "object": "chat.completion", "choices": []})

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenized += 1
        await request.json()
        return web.json_response({"count": self.count, "max_model_len": CTX, "tokens": []})

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return self.runner.addresses[0][1]


def _req(text: str, max_tokens: int | None, image: str | None = None) -> c.Request:
    parts: list[c.Part] = [c.TextPart(text)]
    if image is not None:
        parts.append(c.ImagePart(image))
    return c.Request(model="m", messages=[c.Message("user", parts)], max_tokens=max_tokens)


def _run(upstream: Upstream, kind: str, req: c.Request) -> tuple[Tracked, dict]:
    """open_chat for `req` on one backend of `kind` (context CTX, from its config) -> the request
    record and the status of the upstream's answer, or the GatewayError raised."""

    async def main():
        port = await upstream.start()
        b = cfgmod.parse({"backends": {"u": {"url": f"http://127.0.0.1:{port}/v1", "slots": 1, "kind": kind,
                                             "max_model_len": CTX}},
                          "models": {"m": {"backend": "u"}}}).backends["u"]
        route = Route("m", "m", "m", (BackendState("u", b, SlotPool("u", 1, 4, 5.0)),), None, affinity=False)
        clients = {"u": UpstreamClient("u", b)}
        t = Tracked("req_c1", "openai", "m", None, False)
        try:
            async with Exchange(t, route, clients) as ex:
                await ex.admit()
                try:
                    resp = await open_chat(ex, req, stream=False)
                except GatewayError as err:
                    return t, {"error": err}
                await resp.read()
                ex.complete = True
                return t, {"status": resp.status}
        finally:
            await clients["u"].close()
            await upstream.runner.cleanup()

    return asyncio.run(main())


def test_a_request_a_high_estimate_leaves_room_for_is_neither_counted_nor_clamped():
    up = Upstream(count=50)
    t, out = _run(up, "vllm", _req("hello", 1000))
    assert out == {"status": 200}
    assert [ch["max_tokens"] for ch in up.chats] == [1000]
    assert up.tokenized == 0 and t.clamp is None


def test_a_backend_with_a_tokenizer_clamps_to_the_context_less_its_count():
    up = Upstream(count=1234)
    t, out = _run(up, "vllm", _req("word " * 200, 128000))
    assert out == {"status": 200}
    assert [ch["max_tokens"] for ch in up.chats] == [CTX - 1234]
    assert up.tokenized == 1 and t.clamp == "tokenizer"


def test_a_prompt_the_tokenizer_counts_past_the_context_is_the_clients_error_before_any_chat():
    up = Upstream(count=CTX + 10)
    t, out = _run(up, "vllm", _req("word " * 200, 4000))
    err = out["error"]
    assert err.status == 400 and err.param == "messages"
    assert f"the prompt is {CTX + 10} tokens" in err.message and f"context of {CTX} tokens" in err.message
    assert up.chats == []  # nothing was sent to generate


def test_a_backend_without_a_tokenizer_clamps_on_the_low_estimate():
    up = Upstream()
    text = "word " * 2000
    req = _req(text, 128000)
    t, out = _run(up, "openai", req)
    assert out == {"status": 200}
    assert up.tokenized == 0 and t.clamp == "estimate"
    sent = up.chats[0]
    # one token per 8 bytes of the body it sent with the answer's room unknown: a low estimate
    body_len = len(json.dumps(sent, separators=(",", ":")))
    assert CTX - body_len // 8 - 2 <= sent["max_tokens"] <= CTX - body_len // 8 + 2
    assert sent["max_tokens"] < CTX - len(text) // 8 + 1


def test_image_data_is_not_counted_as_prompt_text():
    up = Upstream()
    image = "data:image/png;base64," + "A" * 80_000  # an 80 kB screenshot: 10000 "tokens" as text
    t, out = _run(up, "openai", _req("what is this?", 1000, image))
    assert out == {"status": 200}
    assert [ch["max_tokens"] for ch in up.chats] == [1000] and t.clamp is None


def test_a_refusal_that_says_the_prompt_size_is_retried_once_with_exactly_what_fits():
    up = Upstream(refuse_prompt=3000)
    t, out = _run(up, "openai", _req("hello", 2000))  # a small body: no clamp before the first try
    assert out == {"status": 200}
    assert [ch["max_tokens"] for ch in up.chats] == [2000, CTX - 3000]
    assert t.clamp == "retry"


def test_a_refusal_that_leaves_no_room_is_the_clients_error_without_a_retry():
    up = Upstream(refuse_prompt=CTX + 5)
    t, out = _run(up, "openai", _req("hello", 2000))
    err = out["error"]
    assert err.status == 400 and err.param == "messages" and f"the prompt is {CTX + 5} tokens" in err.message
    assert len(up.chats) == 1


@pytest.mark.parametrize("refusal", [
    "temperature must be at most 2",  # not about the context
    # about the context, but max_tokens already fits: retrying with more would not help
    f"This model's maximum context length is {CTX} tokens. However, your request has 100 input tokens.",
])
def test_another_400_reaches_the_client_as_the_upstream_said_it(refusal):
    up = Upstream(refusal=refusal)
    t, out = _run(up, "openai", _req("hello", 2000))
    err = out["error"]
    assert err.status == 400 and refusal in err.message
    assert len(up.chats) == 1 and t.clamp is None
