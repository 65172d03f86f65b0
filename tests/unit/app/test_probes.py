"""The probe scheduler's verdicts (app/probes.py, ops/health.py) against a real server in this
process: late is not gone (down only after `LATE_PROBES` late probes in a row), a refused
connection is down at once, an answer on time forgets the lateness."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from homelab_frontend import config as cfgmod
from homelab_frontend.app.gateway import Gateway
from homelab_frontend.app.probes import Probes
from homelab_frontend.ops import health


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slow:
    """A /v1/models that answers `delay_s` late for its next `late` asks."""

    def __init__(self) -> None:
        self.late, self.delay_s, self.asked = 0, 0.0, 0

    async def models(self, request: web.Request) -> web.Response:
        self.asked += 1
        if self.late > 0:
            self.late -= 1
            await asyncio.sleep(self.delay_s)
        return web.json_response({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})


def _run(tmp_path, body, port: int | None = None) -> None:
    async def main() -> None:
        slow = Slow()
        app = web.Application()
        app.router.add_get("/v1/models", slow.models)
        runner = web.AppRunner(app)
        await runner.setup()
        site_port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", site_port).start()
        cfg = cfgmod.parse({
            "backends": {"a": {"url": f"http://127.0.0.1:{port or site_port}/v1", "slots": 1, "kind": "openai",
                               "health_interval_s": 0.2}},
            "models": {"m": {"backend": "a"}},
            "responses": {"store": {"path": str(tmp_path / "responses.sqlite3")}},
        })
        gw = Gateway(cfg)
        assert isinstance(gw.probes, Probes)
        gw.probes.close()  # its loops stopped: the test asks for each probe itself
        try:
            await body(gw, slow)
        finally:
            await gw.close()
            await runner.cleanup()

    asyncio.run(main())


def test_late_probes_leave_a_backend_up_until_the_limit_in_a_row(tmp_path):
    async def body(gw: Gateway, slow: Slow) -> None:
        state = gw.backends["a"]
        await gw.probes.probe("a")
        assert state.up and state.model_lens == {"m": 4096}
        slow.late, slow.delay_s = 10, 1.0
        for _ in range(health.LATE_PROBES - 1):
            await gw.probes.probe("a")
            assert state.up and state.last_error is None  # late, not gone
        await gw.probes.probe("a")
        assert not state.up and "did not answer /models within 0.2 s" in state.last_error
        slow.late = 0
        await gw.probes.probe("a")
        assert state.up and state.last_error is None
        assert slow.asked == health.LATE_PROBES + 2

    _run(tmp_path, body)


def test_an_answer_on_time_forgets_the_lateness(tmp_path):
    async def body(gw: Gateway, slow: Slow) -> None:
        state = gw.backends["a"]
        slow.delay_s = 1.0
        for _ in range(3):  # late, late, on time: never LATE_PROBES in a row
            slow.late = health.LATE_PROBES - 1
            for _ in range(health.LATE_PROBES - 1):
                await gw.probes.probe("a")
            await gw.probes.probe("a")
            assert state.up

    _run(tmp_path, body)


def test_a_refused_connection_is_down_at_the_first_probe(tmp_path):
    async def body(gw: Gateway, slow: Slow) -> None:
        await gw.probes.probe("a")
        state = gw.backends["a"]
        assert not state.up and "connection refused" in state.last_error

    _run(tmp_path, body, port=_free_port())  # nothing listens there
