"""Running the gateway (app/serve.py), in this process on a free loopback port: the port taken
said in one line before anything starts, a ledger that cannot be written said as an invalid
config, the open-gateway warning, SIGHUP re-reading the file, SIGTERM's drain (a request still
running when the grace ends is cancelled, and the upstream sees it leave) and a second SIGTERM
ending the grace at once; and the start-up helpers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time

import aiohttp
import pytest
import yaml
from aiohttp import web

from homelab_frontend import config as cfgmod
from homelab_frontend.app.serve import StartupError, _loopback, check_port, fail, run, serve


@pytest.mark.parametrize("host, loop", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                        ("127.0.0.2", True), ("0.0.0.0", False), ("192.168.1.5", False),
                                        ("gpu-box.lan", False)])
def test_loopback(host, loop):
    assert _loopback(host) is loop


def test_fail_is_one_line_and_status_2(capsys):
    assert fail("cannot listen on 127.0.0.1:1: permission denied") == 2
    captured = capsys.readouterr()
    assert captured.err == "homelab-frontend: cannot listen on 127.0.0.1:1: permission denied\n"
    assert captured.out == ""


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.fixture
def own_signals():
    """serve() handles SIGTERM, SIGINT and SIGHUP on its loop, and the loop's close leaves them
    at their defaults: give this process (a pytest worker, perhaps under coverage) its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_taken_port_is_said_before_anything_starts(taken_port):
    with pytest.raises(StartupError) as err:
        check_port("127.0.0.1", taken_port)
    assert str(err.value) == f"cannot listen on 127.0.0.1:{taken_port}: address already in use"
    check_port("127.0.0.1", 0)  # any free port: nothing to check


def _config(tmp_path, upstream_port: int = 9, **extra) -> dict:
    return {
        "backends": {"u": {"url": f"http://127.0.0.1:{upstream_port}/v1", "slots": 2}},
        "models": {"m": {"backend": "u"}},
        "responses": {"store": {"path": str(tmp_path / "r.sqlite3")}},
        "usage": {"path": str(tmp_path / "u.sqlite3")},
        **extra,
    }


def test_run_says_a_taken_port_in_one_line_and_exits_2(tmp_path, taken_port, capsys, own_signals):
    assert run(cfgmod.parse(_config(tmp_path)), None, "127.0.0.1", taken_port) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == f"homelab-frontend: cannot listen on 127.0.0.1:{taken_port}: address already in use"
    assert "listening" not in captured.out


def test_run_says_a_ledger_it_cannot_write_as_an_invalid_config(tmp_path, capsys, own_signals):
    (tmp_path / "file").write_text("")
    cfg = cfgmod.parse(_config(tmp_path, usage={"path": str(tmp_path / "file" / "u.sqlite3")}))
    assert run(cfg, None, "127.0.0.1", 0) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("homelab-frontend: invalid config: usage.path: cannot create") and "file" in err


class HangingUpstream:
    """/v1/models answers; a chat hangs until the gateway leaves it, which it records."""

    def __init__(self) -> None:
        self.chats = 0
        self.left = asyncio.Event()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.chats += 1
        out = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await out.prepare(request)
        try:
            await asyncio.Event().wait()
        finally:
            self.left.set()
        return out

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return self.runner.addresses[0][1]


async def _until(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _drive(tmp_path, grace_s: float, signals: int):
    """serve() on a free port with a chat hanging upstream; SIGHUP after a new model is written
    to the file, then `signals` SIGTERMs -> (serve's status, seconds from the first SIGTERM to its
    return, what the test saw)."""
    path = tmp_path / "config.yaml"

    async def main():
        up = HangingUpstream()
        port = await up.start()
        cfg = _config(tmp_path, port, shutdown_grace_s=grace_s)
        path.write_text(yaml.safe_dump(cfg))
        bound: list[int] = []
        server = asyncio.get_running_loop().create_task(
            serve(cfgmod.load(str(path)), str(path), "127.0.0.1", 0, ready=bound.append))
        await _until(lambda: bound or server.done(), "the gateway to listen")
        base = f"http://127.0.0.1:{bound[0]}"
        seen = {}
        try:
            async with aiohttp.ClientSession() as s:
                cfg["models"]["late"] = {"backend": "u"}
                path.write_text(yaml.safe_dump(cfg))
                os.kill(os.getpid(), signal.SIGHUP)

                async def listed() -> set[str]:
                    async with s.get(base + "/v1/models") as r:
                        return {m["id"] for m in (await r.json())["data"]}

                for _ in range(1500):
                    if "late" in await listed():
                        break
                    await asyncio.sleep(0.02)
                seen["models"] = await listed()

                async def chat() -> tuple[int, bytes]:
                    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                    async with s.post(base + "/v1/chat/completions", json=body) as r:
                        return r.status, await r.read()

                asking = asyncio.get_running_loop().create_task(chat())
                await _until(lambda: up.chats == 1, "the chat to reach the upstream")
                t0 = time.monotonic()
                for _ in range(signals):
                    os.kill(os.getpid(), signal.SIGTERM)
                    await asyncio.sleep(0.1)
                status = await asyncio.wait_for(server, 60)
                elapsed = time.monotonic() - t0
                try:
                    seen["chat"] = await asyncio.wait_for(asking, 10)
                except aiohttp.ClientError as err:
                    seen["chat"] = err
                seen["upstream left"] = up.left.is_set()
                return status, elapsed, seen
        finally:
            if not server.done():
                server.cancel()
            await up.runner.cleanup()

    return asyncio.run(main())


def test_sighup_reloads_and_sigterm_cancels_what_outlives_the_grace(tmp_path, capsys, caplog, own_signals):
    caplog.set_level(logging.INFO, logger="homelab_frontend")
    status, _, seen = _drive(tmp_path, grace_s=0.5, signals=1)
    assert status == 0
    assert seen["models"] >= {"m", "late"}  # the file re-read on SIGHUP
    assert seen["upstream left"]  # the running generation was cancelled, upstream too
    out = capsys.readouterr().out
    assert out.startswith("homelab-frontend listening on http://127.0.0.1:")
    said = [r.getMessage() for r in caplog.records]
    assert "no client keys configured: the gateway is open to anyone who can reach it" in said
    assert "shutting down: 1 requests in flight, up to 0.5 s to finish" in said
    assert "shutdown: cancelling 1 requests still running" in said
    assert said[-1] == "shutdown complete"


def test_a_second_sigterm_ends_the_grace_at_once(tmp_path, caplog, own_signals):
    caplog.set_level(logging.INFO, logger="homelab_frontend")
    status, elapsed, seen = _drive(tmp_path, grace_s=600, signals=2)
    assert status == 0 and seen["upstream left"]
    assert elapsed < 300  # nowhere near the 600 s grace: the second signal cut it short
    assert "shutdown: cancelling 1 requests still running" in [r.getMessage() for r in caplog.records]
