"""A managed backend's HTTP probes (lifecycle/probe.py) against servers on 127.0.0.1 in this
process: the stubs (vLLM's sleep endpoints, llama.cpp's 503 while it loads) and a tiny server for
the odd answers (an error status, a body that is not the expected JSON, no answer at all).

What is decided: ready only on a 200 from the ready URL, never an exception; sleep and wake raise
with the status when refused or when they outlast their timeout (the caller then stops or starts
the server afresh); is_sleeping is None when the answer cannot tell."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from homelab_frontend import config as cfgmod
from homelab_frontend.lifecycle import probe
from homelab_frontend.lifecycle.probe import Prober, ready_url, root_url
from homelab_frontend.stub.server import StubServer
from homelab_frontend.stub.state import StubConfig
from stubproc import free_port

BOUND_S = 30  # a probe that hung would fail the test here instead of holding the worker


def _backend(url: str, **run) -> cfgmod.Backend:
    return cfgmod.Backend(url=url, run=cfgmod.Run(cmd=["server"], **run))


def test_the_ready_url_defaults_to_the_models_list_and_the_sleep_endpoints_sit_beside_v1():
    assert ready_url(_backend("http://h:1/v1")) == "http://h:1/v1/models"
    assert ready_url(_backend("http://h:1/v1/")) == "http://h:1/v1/models"
    assert ready_url(_backend("http://h:1/v1", ready_url="http://h:1/health")) == "http://h:1/health"
    assert root_url(_backend("http://h:1/v1")) == "http://h:1"
    assert root_url(_backend("http://h:1/v1/")) == "http://h:1"
    assert root_url(_backend("http://h:1/api")) == "http://h:1/api"  # only a /v1 is the API's own


def test_a_server_without_v1_models_is_ready_by_its_health_path():
    # whisper.cpp's server has no /v1/models: its kind's /health, or the backend's health_path
    whisper = cfgmod.Backend(url="http://h:1", kind="whispercpp", run=cfgmod.Run(cmd=["whisper-server"]))
    assert ready_url(whisper) == "http://h:1/health"
    sd = cfgmod.Backend(url="http://h:1/v1", health_path="/", run=cfgmod.Run(cmd=["sd-server"]))
    assert ready_url(sd) == "http://h:1/"


class Odd:
    """A server with the answers no real backend should give: /v1/models 500, /is_sleeping a JSON
    list or text, /hang never (until the server closes)."""

    def __init__(self) -> None:
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> "Odd":
        async def hang(request):
            await asyncio.Event().wait()

        async def error(request):
            return web.Response(status=500, text="boom")

        async def a_list(request):
            return web.json_response([True])

        async def text(request):
            return web.Response(text="yes")

        async def not_found(request):  # FastAPI's 404, as a vLLM without VLLM_SERVER_DEV_MODE answers
            return web.json_response({"detail": "Not Found"}, status=404)

        app = web.Application()
        app.router.add_get("/v1/models", error)
        app.router.add_get("/list/is_sleeping", a_list)
        app.router.add_get("/text/is_sleeping", text)
        app.router.add_get("/missing/is_sleeping", not_found)
        for path in ("/hang/v1/models", "/hang/is_sleeping"):
            app.router.add_get(path, hang)
        app.router.add_post("/hang/sleep", hang)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, BOUND_S))


def test_ready_is_a_200_from_the_ready_url_and_llama_cpp_s_loading_503_is_not():
    async def main():
        prober = Prober()
        try:
            async with StubServer(StubConfig(flavour="vllm")) as vllm:
                assert await prober.ready(_backend(vllm.url + "/v1")) is True
                assert await prober.ready(_backend(vllm.url + "/v1", ready_url=vllm.url + "/nowhere")) is False
            async with StubServer(StubConfig(flavour="llamacpp", start_delay_s=3600)) as llama:
                b = _backend(llama.url + "/v1")
                assert await prober.ready(b) is False  # bound, answering 503 "Loading model"
                llama.state.loading = False
                assert await prober.ready(b) is True
            async with Odd() as odd:
                assert await prober.ready(_backend(odd.url + "/v1")) is False  # a 500
        finally:
            await prober.close()

    _run(main())


def test_ready_is_false_when_nothing_listens_or_nothing_answers_in_time(monkeypatch):
    monkeypatch.setattr(probe, "TIMEOUT_S", 0.3)

    async def main():
        prober = Prober()
        try:
            assert await prober.ready(_backend(f"http://127.0.0.1:{free_port()}/v1")) is False
            async with Odd() as odd:
                assert await prober.ready(_backend(odd.url + "/hang/v1")) is False
        finally:
            await prober.close()

    _run(main())


def test_listening_is_whether_anything_accepts_at_the_backends_address():
    """Asked before a spawn: a listener that never answers HTTP counts (it holds the port); a
    port only bound, or a URL whose port cannot be read, does not."""
    import socket

    async def main():
        prober = Prober()
        with socket.socket() as held, socket.socket() as bound:
            held.bind(("127.0.0.1", 0))
            held.listen()
            bound.bind(("127.0.0.1", 0))
            assert await prober.listening(_backend(f"http://127.0.0.1:{held.getsockname()[1]}/v1")) is True
            assert await prober.listening(_backend(f"http://127.0.0.1:{bound.getsockname()[1]}/v1")) is False
            assert await prober.listening(_backend("http://127.0.0.1:99999/v1")) is False
        async with StubServer(StubConfig(flavour="vllm")) as vllm:
            assert await prober.listening(_backend(vllm.url + "/v1")) is True
        await prober.close()

    _run(main())


def test_sleep_and_wake_drive_vllm_s_dev_endpoints_and_is_sleeping_reads_them():
    async def main():
        prober = Prober()
        try:
            async with StubServer(StubConfig(flavour="vllm", sleep_delay_s=0, wake_delay_s=0)) as vllm:
                b = _backend(vllm.url + "/v1")
                assert await prober.is_sleeping(b) is False
                await prober.sleep(b, 2, timeout_s=10)
                assert vllm.state.sleeping == 2  # the level reached the server
                assert await prober.is_sleeping(b) is True
                assert await prober.ready(b) is True  # vLLM's /v1/models answers while it sleeps
                await prober.wake(b, timeout_s=10)
                assert vllm.state.sleeping == 0
                assert await prober.is_sleeping(b) is False
        finally:
            await prober.close()

    _run(main())


def test_a_refused_sleep_or_wake_raises_with_the_status_and_the_body():
    async def main():
        prober = Prober()
        try:
            async with StubServer(StubConfig(flavour="llamacpp")) as llama:  # no sleep mode at all
                b = _backend(llama.url + "/v1")
                with pytest.raises(RuntimeError, match=r"sleep\?level=1 answered 404: b'404: Not Found'"):
                    await prober.sleep(b, 1, timeout_s=10)
                with pytest.raises(RuntimeError, match=r"wake_up answered 404"):
                    await prober.wake(b, timeout_s=10)
        finally:
            await prober.close()

    _run(main())


def test_a_sleep_that_outlasts_its_timeout_raises():
    async def main():
        prober = Prober()
        try:
            async with Odd() as odd:
                with pytest.raises(TimeoutError):
                    await prober.sleep(_backend(odd.url + "/hang/v1"), 1, timeout_s=0.3)
        finally:
            await prober.close()

    _run(main())


def test_is_sleeping_is_none_when_the_answer_cannot_tell(monkeypatch):
    async def main():
        prober = Prober()
        try:
            assert await prober.is_sleeping(_backend(f"http://127.0.0.1:{free_port()}/v1")) is None
            async with Odd() as odd:
                assert await prober.is_sleeping(_backend(odd.url + "/list/v1")) is None
                assert await prober.is_sleeping(_backend(odd.url + "/text/v1")) is None
                assert await prober.is_sleeping(_backend(odd.url + "/missing/v1")) is None
                monkeypatch.setattr(probe, "TIMEOUT_S", 0.3)  # read when a session is made
                await prober.close()
                assert await prober.is_sleeping(_backend(odd.url + "/hang/v1")) is None
        finally:
            await prober.close()

    _run(main())


def test_one_session_serves_every_probe_until_closed_and_a_closed_one_is_replaced():
    async def main():
        prober = Prober()
        await prober.close()  # nothing opened yet: nothing to close
        first = prober.session()
        assert prober.session() is first
        await prober.close()
        assert first.closed
        second = prober.session()
        assert second is not first and not second.closed
        async with StubServer(StubConfig(flavour="vllm")) as vllm:
            assert await prober.ready(_backend(vllm.url + "/v1")) is True
        await prober.close()

    _run(main())
