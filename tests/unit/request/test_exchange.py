"""The exchange and its watchdog (request/exchange.py), over a real aiohttp upstream on a free
loopback port: the slot is held from admission to the end, a read-to-the-end exchange gives it
back at once, an aborted one only after the upstream can have seen the abort, and a silent
upstream is cancelled with the timeout's reason."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.routing import BackendState, Route
from homelab_frontend.request.exchange import Exchange
from homelab_frontend.request.tracker import CONNECTING, QUEUED, Tracked
from homelab_frontend.upstream.client import UpstreamClient


async def _upstream(hang: asyncio.Event | None = None):
    seen = {"aborted": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await out.prepare(request)
        if hang is not None:
            try:
                await hang.wait()
            except asyncio.CancelledError:
                seen["aborted"] += 1  # the gateway closed the connection
                raise
        await out.write(b'data: {"choices":[]}\n\ndata: [DONE]\n\n')
        return out

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1], seen


def _route(port: int, **timeouts) -> tuple[Route, dict[str, UpstreamClient]]:
    b = cfgmod.parse({"backends": {"u": {"url": f"http://127.0.0.1:{port}/v1", "slots": 1,
                                         "timeouts": timeouts}},
                      "models": {"m": {"backend": "u"}}}).backends["u"]
    state = BackendState("u", b, SlotPool("u", 1, 4, 5.0))
    route = Route("m", "m", "m", (state,), None, affinity=False)
    return route, {"u": UpstreamClient("u", b)}


def test_read_to_the_end_gives_the_slot_back_at_once():
    async def main():
        runner, port, _ = await _upstream()
        route, clients = _route(port)
        pool = route.backends[0].pool
        t = Tracked("req_e1", "openai", "m", None, True)
        try:
            async with Exchange(t, route, clients) as ex:
                assert t.phase == QUEUED
                await ex.admit()
                assert pool.in_use == 1 and t.queue_wait is not None
                resp = await ex.open("/chat/completions", b"{}", stream=True)
                assert t.phase != CONNECTING and t.upstream_headers is not None
                assert (await resp.read()).endswith(b"[DONE]\n\n")
                ex.complete = True
            assert pool.in_use == 0
        finally:
            await clients["u"].close()
            await runner.cleanup()

    asyncio.run(main())


def test_an_aborted_exchange_closes_upstream_then_gives_the_slot_back():
    async def main():
        hang = asyncio.Event()
        runner, port, seen = await _upstream(hang)
        route, clients = _route(port)
        pool = route.backends[0].pool
        t = Tracked("req_e2", "openai", "m", None, True)
        try:
            async def handler():
                async with Exchange(t, route, clients) as ex:
                    await ex.admit()
                    resp = await ex.open("/chat/completions", b"{}", stream=True)
                    await resp.content.read()  # hangs: the client leaves meanwhile

            task = asyncio.get_running_loop().create_task(handler())
            while pool.in_use == 0 or t.upstream_headers is None:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool.in_use == 0  # given back when the exchange was left
            for _ in range(100):
                if seen["aborted"]:
                    break
                await asyncio.sleep(0.01)
            assert seen["aborted"] == 1  # the upstream saw its connection close
        finally:
            await clients["u"].close()
            await runner.cleanup()

    asyncio.run(main())


def test_a_silent_upstream_is_cancelled_with_the_timeout_reason():
    async def main():
        hang = asyncio.Event()
        runner, port, _ = await _upstream(hang)
        route, clients = _route(port, first_token_s=0.3)
        t = Tracked("req_e3", "openai", "m", None, True)
        try:
            async def handler():
                t.task = asyncio.current_task()
                async with Exchange(t, route, clients) as ex:
                    await ex.admit()
                    resp = await ex.open("/chat/completions", b"{}", stream=True)
                    try:
                        await resp.content.read()
                    except asyncio.CancelledError:
                        return ex.own_cancel()

            err = await asyncio.wait_for(handler(), 5)
            assert isinstance(err, GatewayError) and err.kind == "timeout"
            assert t.cancel_reason == "timeout"
            assert route.backends[0].pool.in_use == 0
        finally:
            await clients["u"].close()
            await runner.cleanup()

    asyncio.run(main())


def test_all_backends_down_is_counted_against_the_first():
    async def main():
        route, clients = _route(9)
        route.backends[0].up = False
        t = Tracked("req_e4", "openai", "m", None, False)
        with pytest.raises(GatewayError) as e:
            async with Exchange(t, route, clients) as ex:
                await ex.admit()
        assert e.value.kind == "backend_down" and t.backend == "u"
        await clients["u"].close()

    asyncio.run(main())



def _two(ports: list[int], slots: int = 1) -> tuple[Route, dict[str, UpstreamClient]]:
    cfg = cfgmod.parse({"backends": {f"b{i}": {"url": f"http://127.0.0.1:{p}/v1", "slots": slots}
                                     for i, p in enumerate(ports)},
                        "models": {"m": {"backends": [f"b{i}" for i in range(len(ports))]}}})
    states = tuple(BackendState(n, b, SlotPool(n, b.slots, 4, 5.0)) for n, b in cfg.backends.items())
    return Route("m", "m", "m", states, None, affinity=False), {n: UpstreamClient(n, b) for n, b in cfg.backends.items()}


def test_attempt_moves_to_the_next_backend_each_once_and_gives_each_slot_back():
    async def main():
        import socket

        runner, good, _ = await _upstream()
        # a port bound and never listened on, for the whole test: connection refused, and no
        # other process can take it meanwhile (a closed one could be handed out again)
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        dead = held.getsockname()[1]
        route, clients = _two([dead, dead, good])
        b0, b1, b2 = route.backends
        t = Tracked("req_f1", "openai", "m", None, True)
        try:
            async with Exchange(t, route, clients) as ex:
                assert (await ex.admit()) is b0
                resp = await ex.attempt(lambda: ex.open("/chat/completions", b"{}", stream=True))
                assert (await resp.read()).endswith(b"[DONE]\n\n")
                ex.complete = True
                assert ex.backend is b2 and (b0.pool.in_use, b1.pool.in_use, b2.pool.in_use) == (0, 0, 1)
            assert t.failovers == [("b0", "unreachable"), ("b1", "unreachable")]
            assert t.tried() == ["b0", "b1", "b2"] and b2.pool.in_use == 0
            assert b0.passive.fails == 1 and b0.up  # one failure: not yet down
            # every backend failing: the last failure is raised, nothing held
            t2 = Tracked("req_f2", "openai", "m", None, True)
            b2.up = False
            with pytest.raises(GatewayError) as e:
                async with Exchange(t2, route, clients) as ex:
                    await ex.admit()
                    await ex.attempt(lambda: ex.open("/chat/completions", b"{}", stream=True))
            assert e.value.kind == "upstream_unreachable" and "'b1'" in e.value.message
            assert t2.tried() == ["b0", "b1"] and not b0.up and not b1.up  # the second failure in a row
            assert (b0.pool.in_use, b1.pool.in_use) == (0, 0)
        finally:
            held.close()
            for c in clients.values():
                await c.close()
            await runner.cleanup()

    asyncio.run(main())


async def _tokenizer(hang: asyncio.Event | None = None):
    """A llama.cpp-shaped tokenizer (/apply-template, /tokenize) that may hang in /tokenize."""
    seen = {"aborted": 0, "calls": 0}

    async def apply_template(request: web.Request) -> web.Response:
        doc = await request.json()
        return web.json_response({"prompt": " ".join(m["content"] for m in doc["messages"])})

    async def tokenize(request: web.Request) -> web.Response:
        seen["calls"] += 1
        doc = await request.json()
        if hang is not None:
            try:
                await hang.wait()
            except asyncio.CancelledError:
                seen["aborted"] += 1
                raise
        return web.json_response({"tokens": list(range(len(doc["content"].split())))})

    app = web.Application()
    app.router.add_post("/apply-template", apply_template)
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1], seen


def _llama_route(port: int) -> tuple[Route, dict[str, UpstreamClient]]:
    b = cfgmod.parse({"backends": {"u": {"url": f"http://127.0.0.1:{port}", "slots": 1, "kind": "llamacpp"}},
                      "models": {"m": {"backend": "u"}}}).backends["u"]
    state = BackendState("u", b, SlotPool("u", 1, 4, 5.0))
    return Route("m", "m", "m", (state,), None, affinity=False), {"u": UpstreamClient("u", b)}


CHAT = b'{"messages":[{"role":"user","content":"one two three four five"}]}'


def test_the_prompt_count_runs_beside_and_is_read_once_it_arrived():
    async def main():
        runner, port, seen = await _tokenizer()
        route, clients = _llama_route(port)
        t = Tracked("req_c1", "anthropic", "m", None, True)
        try:
            async with Exchange(t, route, clients) as ex:
                await ex.admit()
                assert ex.prompt_tokens is None and await ex.counted_prompt() is None  # none started
                read = ex.prompt_tokens_or(99)
                assert ex.count_prompt(CHAT) and ex.count_prompt(CHAT)  # the second reuses the first
                assert read() == 99  # not arrived yet: the fallback
                assert await ex.counted_prompt(5.0) == 5
                assert ex.prompt_tokens == 5 and read() == 5 and seen["calls"] == 1
        finally:
            await clients["u"].close()
            await runner.cleanup()

    asyncio.run(main())


def test_leaving_the_exchange_cancels_a_count_still_running():
    async def main():
        hang = asyncio.Event()
        runner, port, seen = await _tokenizer(hang)
        route, clients = _llama_route(port)
        t = Tracked("req_c2", "anthropic", "m", None, True)
        try:
            async with Exchange(t, route, clients) as ex:
                await ex.admit()
                ex.count_prompt(CHAT)
                assert await ex.counted_prompt(0.2) is None  # a bounded wait gives up, the count goes on
                assert not ex._count.done()
            for _ in range(200):
                if seen["aborted"]:
                    break
                await asyncio.sleep(0.01)
            assert seen["aborted"] == 1 and ex.prompt_tokens is None  # the tokenizer saw it go
        finally:
            hang.set()
            await clients["u"].close()
            await runner.cleanup()

    asyncio.run(main())


def test_a_backend_without_a_tokenizer_starts_no_count():
    async def main():
        route, clients = _route(9)  # vllm-less default kind: nothing is contacted
        route.backends[0].cfg = cfgmod.parse({"backends": {"u": {"url": "http://127.0.0.1:9/v1", "kind": "ollama"}},
                                              "models": {"m": {"backend": "u"}}}).backends["u"]
        async with Exchange(Tracked("req_c3", "anthropic", "m", None, True), route, clients) as ex:
            await ex.admit()
            assert not ex.count_prompt(CHAT) and await ex.counted_prompt() is None
        await clients["u"].close()

    asyncio.run(main())


def test_a_box_going_down_fails_over_a_request_still_waiting_for_its_headers():
    from homelab_frontend.policy.routing import PeerLink
    from homelab_frontend.request.exchange import _unless_box_down
    from homelab_frontend.upstream.client import UpstreamFailure

    b = cfgmod.parse({"backends": {"box1": {"url": "http://127.0.0.1:9/llm/v1", "kind": "peer"}}}).backends["box1"]

    async def main():
        state = BackendState("box1/gpu0", b, SlotPool("box1/gpu0", 1, 4, 5.0), peer=PeerLink("box1", "gpu0"))
        state.last_error = "backend 'box1/gpu0' is down with its peer: no answer"
        started, cancelled = asyncio.Event(), []

        async def silent():  # a black-holed box: no headers, ever
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        waiting = asyncio.ensure_future(_unless_box_down(state, silent()))
        await started.wait()
        state.peer.mark_down()
        with pytest.raises(UpstreamFailure) as err:
            await asyncio.wait_for(waiting, 5)
        assert err.value.cause == "box_down" and "box1/gpu0" in err.value.message
        assert cancelled  # the request to the box is closed, not left behind

        async def answers():
            return "headers"
        assert await _unless_box_down(state, answers()) == "headers"  # an answer first passes through

    asyncio.run(main())
