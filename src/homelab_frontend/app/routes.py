"""The gateway's HTTP routes: every surface endpoint, health and readiness, ops, the dashboard."""

from __future__ import annotations

from typing import Awaitable, Callable, TypedDict

from aiohttp import web

from ..errors import GatewayError
from ..ops import admin, metrics, usage_api
from ..request.tracker import Tracked
from ..surfaces import count_tokens
from ..surfaces.anthropic import handler as anthropic_surface
from ..surfaces.completions import handler as completions_surface
from ..surfaces.gemini import handler as gemini_surface
from ..surfaces.media import handler as media
from ..surfaces.ollama import handler as ollama_surface
from ..surfaces.openai import handler as openai_surface
from ..surfaces.responses import handler as responses_surface
from .connguard import ConnectionGuard
from .gateway import GATEWAY, Gateway
from .request_scope import surface


async def healthz(request: web.Request) -> web.Response:
    """Alive. A usage ledger that cannot write (or whose writer died) makes it `degraded`, with
    the reason: the gateway still serves, so a liveness probe must not restart it for that."""
    gw: Gateway = request.app[GATEWAY]
    if gw.usage is not None:
        usage = gw.usage.health()
        if not usage.get("ok", True):
            return web.json_response({"status": "degraded", "usage": usage})
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready while some backend can serve: up by its probe, or managed and stopped (a request
    starts it). A managed backend whose start failed cannot; `why` names each one that cannot."""
    gw: Gateway = request.app[GATEWAY]
    why: dict[str, str] = {}
    for name, b in gw.backends.items():
        failed = gw.fleet.unavailable(name)
        if failed is not None:
            why[name] = failed
        elif not b.up:
            why[name] = b.last_error or "down"
    up = {name: name not in why for name in gw.backends}
    ready = any(up.values()) and not gw.draining
    body: dict = {"ready": ready, "backends": up}
    if why:
        body["why"] = why
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


def _by_client(google, other):
    """One path both dialects share: Google's clients (their key header, `?key=` or their client
    header) get the Gemini answer, every other client the OpenAI one."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await (google if gemini_surface.is_google_client(request) else other)(request)

    return handler


async def _expect(request: web.Request) -> None:
    """`Expect: 100-continue` is answered as usual; any other expectation is ignored rather
    than refused with aiohttp's bare-text 417, so the client still gets its dialect's answer."""
    if request.version >= (1, 1) and request.headers.get("expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


class _RouteOptions(TypedDict):
    expect_handler: Callable[[web.Request], Awaitable[None]]


def build_app(gw: Gateway) -> web.Application:
    # connections: (head deadline, cap) is read once: like cluster:, it takes a restart to change
    guard = gw.connguard = ConnectionGuard(gw.cfg.connections)
    app = web.Application(client_max_size=gw.cfg.limits.max_body_bytes, middlewares=[guard.middleware])
    app[GATEWAY] = gw
    r = app.router
    x: _RouteOptions = {"expect_handler": _expect}
    # The OpenAI-shaped surfaces at /llm/v1, and at the host's root too: VS Code Copilot's Ollama
    # provider lists models over /api and then chats at <host>/v1/chat/completions.
    for v1 in ("/llm/v1", "/v1"):
        r.add_post(f"{v1}/chat/completions", surface("openai", openai_surface.chat_completions), **x)
        # GET models is the OpenAI list, and the Gemini one for Google's clients (the GenAI SDK's
        # default API version is v1); the rest of the Gemini API lives under v1beta and v1 alike.
        r.add_get(f"{v1}/models", _by_client(surface("gemini", gemini_surface.list_models),
                                             surface("openai", openai_surface.models)), **x)
        r.add_get(f"{v1}/models/{{name:.+}}", _by_client(surface("gemini", gemini_surface.get_model),
                                                        _unknown("openai")), **x)
        r.add_post(f"{v1}/models/{{target:.+}}", surface("gemini", gemini_surface.model_method), **x)
        r.add_post(f"{v1}/embeddings", surface("openai", openai_surface.embeddings), **x)
        r.add_post(f"{v1}/tokenize", surface("openai", count_tokens.tokenize), **x)  # for a front (peers)
        # the relayed calls (surfaces/media/): rerank, speech, images
        r.add_post(f"{v1}/rerank", surface("rerank", media.rerank), **x)
        r.add_post(f"{v1}/score", surface("rerank", media.score), **x)
        r.add_post(f"{v1}/audio/transcriptions", surface("transcription", media.transcriptions), **x)
        r.add_post(f"{v1}/audio/translations", surface("transcription", media.translations), **x)
        r.add_post(f"{v1}/audio/speech", surface("speech", media.speech), **x)
        r.add_get(f"{v1}/audio/models", surface("speech", media.audio_models), **x)
        r.add_get(f"{v1}/audio/voices", surface("speech", media.audio_voices), **x)
        r.add_post(f"{v1}/images/generations", surface("images", media.image_generations), **x)
        r.add_post(f"{v1}/images/edits", surface("images", media.image_edits), **x)
        r.add_post(f"{v1}/completions", surface("completions", completions_surface.completions), **x)
        r.add_post(f"{v1}/messages", surface("anthropic", anthropic_surface.messages), **x)
        r.add_post(f"{v1}/messages/count_tokens", surface("anthropic", anthropic_surface.count_tokens), **x)
        r.add_post(f"{v1}/responses", surface("responses", responses_surface.create), **x)
        r.add_get(f"{v1}/usage", usage_api.own_usage)
        r.add_get(f"{v1}/responses/{{id}}", surface("responses", responses_surface.retrieve), **x)
        r.add_get(f"{v1}/responses/{{id}}/input_items", surface("responses", responses_surface.input_items), **x)
        r.add_delete(f"{v1}/responses/{{id}}", surface("responses", responses_surface.delete), **x)
        r.add_route("*", f"{v1}/responses/{{tail:.*}}", _unknown("responses"), **x)
        r.add_route("*", f"{v1}/messages/{{tail:.*}}", _unknown("anthropic"), **x)
        r.add_route("*", f"{v1}/messages", _unknown("anthropic"), **x)  # GET /messages: still Anthropic
    for version in ("v1beta", "v1alpha"):
        r.add_get(f"/llm/{version}/models", surface("gemini", gemini_surface.list_models), **x)
        r.add_get(f"/llm/{version}/models/{{name:.+}}", surface("gemini", gemini_surface.get_model), **x)
        r.add_post(f"/llm/{version}/models/{{target:.+}}", surface("gemini", gemini_surface.model_method), **x)
        r.add_route("*", f"/llm/{version}/{{tail:.*}}", _unknown("gemini"), **x)
    # Ollama's own API: at /api (its clients are given a host, not a path) and at /llm/api.
    # /api/version needs no key (surfaces/ollama/handler.py), so it is not a surface route.
    for api in ("/api", "/llm/api"):
        r.add_get(f"{api}/version", ollama_surface.version)
        r.add_get(f"{api}/tags", surface("ollama", ollama_surface.tags), **x)
        r.add_get(f"{api}/ps", surface("ollama", ollama_surface.ps), **x)
        r.add_post(f"{api}/show", surface("ollama", ollama_surface.show), **x)
        r.add_post(f"{api}/chat", surface("ollama", ollama_surface.chat), **x)
        r.add_post(f"{api}/generate", surface("ollama", ollama_surface.generate), **x)
        r.add_post(f"{api}/embed", surface("ollama", ollama_surface.embed), **x)
        r.add_post(f"{api}/embeddings", surface("ollama", ollama_surface.embeddings), **x)
        for managed in ("pull", "push", "create", "copy", "delete", "blobs", "blobs/{digest}"):
            r.add_route("*", f"{api}/{managed}", surface("ollama", ollama_surface.unmanaged), **x)
        r.add_route("*", f"{api}/{{tail:.*}}", _unknown("ollama"), **x)
    # rerank where Jina's, Cohere's and llama.cpp's clients look for it (at the host's root)
    for base in ("", "/llm"):
        r.add_post(f"{base}/rerank", surface("rerank", media.rerank), **x)
        r.add_post(f"{base}/score", surface("rerank", media.score), **x)
        r.add_post(f"{base}/v2/rerank", surface("rerank", media.rerank_v2), **x)
    # llama.cpp's fill-in-the-middle endpoint, where llama.vim and llama.vscode look for it (at the
    # host's root), and its native completion (Continue's and Twinny's llama.cpp providers)
    for at in ("", "/llm"):
        r.add_post(f"{at}/infill", surface("infill", completions_surface.infill), **x)
        r.add_post(f"{at}/completion", surface("infill", completions_surface.native_completion), **x)
    r.add_route("*", "/v1/{tail:.*}", _unknown("openai"), **x)
    # Claude Code warms its connection with `HEAD $ANTHROPIC_BASE_URL`, i.e. HEAD /llm (or /llm/).
    r.add_get("/llm", healthz)
    r.add_get("/llm/", healthz)
    r.add_route("*", "/llm/{tail:.*}", _unknown("openai"), **x)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/", root)  # aiohttp answers HEAD for GET routes
    admin.add_routes(app, gw)
    usage_api.add_routes(app)
    metrics.add_routes(app, gw)

    async def on_startup(app: web.Application) -> None:
        await gw.start()

    async def on_cleanup(app: web.Application) -> None:
        await gw.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
