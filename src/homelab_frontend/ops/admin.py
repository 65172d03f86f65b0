"""The admin API: what is running and queued, cancel one request, reload the config.
Protected by the admin key when one is configured (see auth.Auth.is_admin)."""

from __future__ import annotations

import time

from aiohttp import web

from .context import OPS_GATEWAY, OpsGateway
from .context import gateway as _gw


def _forbidden() -> web.Response:
    return web.json_response(
        {"error": {"type": "authentication_error", "message": "admin key required"}}, status=401
    )


def snapshot(gw: OpsGateway) -> dict:
    backends = {}
    now = time.monotonic()
    for name, b in gw.backends.items():
        backends[name] = {  # no URL: internal addresses stay internal
            "slots": b.pool.slots,
            "in_use": b.pool.in_use,
            "queued": b.pool.queued,
            "up": b.up,
            "last_error": b.last_error,
            "upstream_running": b.upstream_running,
            # how old that reading is: it is re-read on this request, and while slots are held
            "upstream_running_age_s": round(now - b.upstream_running_at, 3)
            if b.upstream_running_at is not None else None,
            # the backend runs more than we hold: a leaked generation, or another client
            "slot_mismatch": (b.upstream_running - b.pool.in_use) if b.upstream_running is not None else None,
        }
        if hasattr(b.pool, "holders"):  # shared through Redis: in_use counts every replica
            backends[name]["held_here"] = b.pool.held
            backends[name]["replicas"] = {r: n for r, n in sorted(b.pool.holders.items()) if n}
    return {
        "requests": [t.as_dict() for t in gw.tracker],
        "backends": backends,
    }


async def list_requests(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return _forbidden()
    await gw.refresh_running()  # the backend's own count as of now, not as of the last probe
    if getattr(gw, "cluster", None) is None:
        return web.json_response(snapshot(gw))
    from . import cluster

    shared = await cluster.view(gw)  # first: it refreshes the pools' cluster-wide counts
    return web.json_response({**snapshot(gw), "cluster": shared})


async def cancel_request(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return _forbidden()
    rid = request.match_info["rid"]
    if gw.tracker.cancel(rid, "admin"):
        return web.json_response({"cancelled": rid})
    return web.json_response(
        {"error": {"type": "not_found_error", "message": f"no running request {rid!r}"}}, status=404
    )


async def reload_config(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return _forbidden()
    problems = gw.reload()
    if problems:
        return web.json_response({"reloaded": False, "problems": problems}, status=400)
    return web.json_response({"reloaded": True})


def add_routes(app: web.Application, gw: OpsGateway) -> None:
    app[OPS_GATEWAY] = gw
    app.router.add_get("/admin/requests", list_requests)
    app.router.add_post("/admin/requests/{rid}/cancel", cancel_request)
    app.router.add_post("/admin/reload", reload_config)
