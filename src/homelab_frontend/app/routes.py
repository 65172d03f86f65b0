"""The gateway's HTTP routes: every surface endpoint, health and readiness, ops, the dashboard."""

from __future__ import annotations

from aiohttp import web

from ..errors import GatewayError
from ..ops import admin, metrics
from ..request.tracker import Tracked
from ..surfaces.anthropic import handler as anthropic_surface
from ..surfaces.openai import handler as openai_surface
from ..surfaces.responses import handler as responses_surface
from .connguard import ConnectionGuard
from .gateway import GATEWAY, Gateway
from .lifecycle import surface


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gw: Gateway = request.app[GATEWAY]
    up = {name: b.up for name, b in gw.backends.items()}
    ready = any(up.values()) and not gw.draining
    body = {"ready": ready, "backends": up}
    if gw.draining:
        body["draining"] = True
    return web.json_response(body, status=200 if ready else 503)


async def root(request: web.Request) -> web.StreamResponse:
    from ..ops import dashboard

    return await dashboard.page(request)


def _unknown(dialect: str):
    async def handler(request: web.Request, gw: Gateway, t: Tracked) -> web.StreamResponse:
        raise GatewayError("not_found", f"no such endpoint: {request.method} {request.path}")

    return surface(dialect, handler)


async def _expect(request: web.Request) -> None:
    """`Expect: 100-continue` is answered as usual; any other expectation is ignored rather
    than refused with aiohttp's bare-text 417, so the client still gets its dialect's answer."""
    if request.version >= (1, 1) and request.headers.get("expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


def build_app(gw: Gateway) -> web.Application:
    # connections: (head deadline, cap) is read once: like cluster:, it takes a restart to change
    guard = gw.connguard = ConnectionGuard(gw.cfg.connections)
    app = web.Application(client_max_size=gw.cfg.limits.max_body_bytes, middlewares=[guard.middleware])
    app[GATEWAY] = gw
    r = app.router
    x = {"expect_handler": _expect}
    r.add_post("/llm/v1/chat/completions", surface("openai", openai_surface.chat_completions), **x)
    r.add_get("/llm/v1/models", surface("openai", openai_surface.models), **x)
    r.add_post("/llm/v1/embeddings", surface("openai", openai_surface.embeddings), **x)
    r.add_post("/llm/v1/messages", surface("anthropic", anthropic_surface.messages), **x)
    r.add_post("/llm/v1/messages/count_tokens", surface("anthropic", anthropic_surface.count_tokens), **x)
    r.add_post("/llm/v1/responses", surface("responses", responses_surface.create), **x)
    r.add_get("/llm/v1/responses/{id}", surface("responses", responses_surface.retrieve), **x)
    r.add_get("/llm/v1/responses/{id}/input_items", surface("responses", responses_surface.input_items), **x)
    r.add_delete("/llm/v1/responses/{id}", surface("responses", responses_surface.delete), **x)
    r.add_route("*", "/llm/v1/responses/{tail:.*}", _unknown("responses"), **x)
    r.add_route("*", "/llm/v1/messages/{tail:.*}", _unknown("anthropic"), **x)
    r.add_route("*", "/llm/v1/messages", _unknown("anthropic"), **x)  # GET /messages: still Anthropic
    # Claude Code warms its connection with `HEAD $ANTHROPIC_BASE_URL`, i.e. HEAD /llm (or /llm/).
    r.add_get("/llm", healthz)
    r.add_get("/llm/", healthz)
    r.add_route("*", "/llm/{tail:.*}", _unknown("openai"), **x)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/", root)  # aiohttp answers HEAD for GET routes
    admin.add_routes(app, gw)
    metrics.add_routes(app, gw)

    async def on_startup(app: web.Application) -> None:
        gw.start_probes()
        if gw.cluster is not None:
            await gw.cluster.start()  # first contact with Redis before the port opens

    async def on_cleanup(app: web.Application) -> None:
        await gw.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
