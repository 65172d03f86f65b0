"""A throwaway aiohttp server on a free port of 127.0.0.1, inside a unit test's own event loop:
the real socket an upstream client or a probe talks to, with the routes the test gives it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve(*routes: web.RouteDef) -> AsyncIterator[str]:
    """A server with `routes` on a free port of 127.0.0.1 -> its /v1 base URL."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()
