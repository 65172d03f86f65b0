"""The floor: a bare aiohttp relay with no translation, no accounting, no limits.

    python -m bench.floor --upstream http://127.0.0.1:PORT/v1

It forwards POST /llm/v1/chat/completions to the upstream with one pooled aiohttp session and
copies the answer back, streamed or whole, batch by batch. Whatever the real gateway costs above
this relay is the price of what it does (parsing, routing, slots, dialects, logs); the relay
itself is the price of the hop with this HTTP stack. `bench.run --floor` measures it alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aiohttp
from aiohttp import web


def build(upstream: str) -> web.Application:
    app = web.Application()
    session: dict[str, aiohttp.ClientSession] = {}

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session["s"].post(upstream + "/chat/completions", data=body,
                                     headers={"content-type": "application/json"}) as up:
            if up.headers.get("content-type", "").startswith("text/event-stream"):
                out = web.StreamResponse(status=up.status, headers={"content-type": "text/event-stream"})
                await out.prepare(request)
                while True:
                    data = await up.content.readany()
                    if not data:
                        break
                    await out.write(data)
                await out.write_eof()
                return out
            return web.Response(status=up.status, body=await up.read(), content_type="application/json")

    async def start(app: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await session["s"].close()

    app.router.add_post("/llm/v1/chat/completions", relay)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


async def serve(upstream: str, port: int) -> None:
    runner = web.AppRunner(build(upstream), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor")
    p.add_argument("--upstream", required=True, help="base URL ending in /v1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.upstream, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
