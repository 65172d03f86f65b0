"""A recording pass-through proxy: what a client really sends, and what it got back.

    with RecordingProxy(gateway.url) as proxy:
        run_client(base_url=proxy.url + "/llm")
        for x in proxy.exchanges: x.method, x.path_qs, x.headers, x.status, x.body

The gateway's access log sees only its /llm routes and no headers or query strings; this sees
every request on the wire (HEAD /, `?beta=true`, `anthropic-beta`, ...). It forwards bytes as they
come, both ways, so streaming behaves as without it, and it runs its own event loop in a thread
so the test process stays free to run the client.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

# Hop-by-hop headers (RFC 9110 7.6.1) plus those aiohttp recomputes for the forwarded message.
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
        "upgrade", "host", "content-length"}


@dataclass
class Exchange:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: Any  # decoded JSON, raw text, or None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    # The response body when it is not an event stream (errors are what we want to see).
    response_body: str | None = None

    @property
    def path(self) -> str:
        return self.path_qs.split("?", 1)[0]


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class RecordingProxy:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        x = Exchange(request.method, request.path_qs, {k.lower(): v for k, v in request.headers.items()}, _decode(raw))
        self.exchanges.append(x)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=raw or None, allow_redirects=False) as up:
            x.status = up.status
            x.response_headers = {k.lower(): v for k, v in up.headers.items()}
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            if "text/event-stream" not in up.headers.get("content-type", ""):
                body = await up.read()
                x.response_body = body.decode(errors="replace")
                return web.Response(status=up.status, headers=out_headers, body=body)
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _start(self) -> None:
        # No automatic decompression: forward exactly what the gateway sent.
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> "RecordingProxy":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
