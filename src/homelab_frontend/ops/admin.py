"""The admin API: what is running and queued, cancel one request, reload the config, and the
managed backends (their states, logs, start and stop).
Protected by the admin key when one is configured (see auth.Auth.is_admin)."""

from __future__ import annotations

import time
from typing import Any, Callable

from aiohttp import web

from .boxes import box_of, boxes_view
from .context import OPS_GATEWAY, OpsGateway
from .context import gateway as _gw


def _forbidden() -> web.Response:
    return web.json_response(
        {"error": {"type": "authentication_error", "message": "admin key required"}}, status=401
    )


def snapshot(gw: OpsGateway) -> dict:
    backends: dict[str, dict[str, Any]] = {}
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
        unit = gw.fleet.units.get(name) if gw.fleet.managed(name) else None
        if unit is not None:  # managed (run:): its lifecycle, for the dashboard's state and buttons
            u = unit.as_dict()
            backends[name]["lifecycle"] = {k: u[k] for k in ("state", "since", "pid", "last_exit", "last_start_s",
                                                             "error", "waiting")}
        if box_of(b) is not None:  # one of a box's backends: the dashboard groups it under the box
            backends[name]["box"] = box_of(b)
        shared = gw.cluster.pools.get(name) if gw.cluster is not None else None
        if shared is not None:  # shared through Redis: in_use counts every replica
            backends[name]["held_here"] = shared.held
            backends[name]["replicas"] = {r: n for r, n in sorted(shared.holders.items()) if n}
    return {
        "requests": [t.as_dict() for t in gw.tracker],
        "backends": backends,
        "boxes": boxes_view(gw.backends, now),
    }


async def list_requests(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return _forbidden()
    await gw.refresh_running()  # the backend's own count as of now, not as of the last probe
    if gw.cluster is None:
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


def _not_found(message: str) -> web.Response:
    return web.json_response({"error": {"type": "not_found_error", "message": message}}, status=404)


def backends_view(gw: OpsGateway) -> list[dict]:
    """Every backend: a managed one with its lifecycle state, an external one as `external`."""
    managed = {u["name"]: u for u in gw.fleet.snapshot()}
    out = []
    for name, b in gw.backends.items():
        entry = managed.get(name) or {
            "name": name, "managed": False, "state": "external", "since": None, "pid": None,
            "last_exit_status": None, "last_exit": None, "last_start_s": None,
        }
        out.append({**entry, "slots": b.pool.slots, "in_use": b.pool.in_use, "queued": b.pool.queued,
                    "up": b.up, "kind": b.cfg.kind, **({"box": box_of(b)} if box_of(b) else {})})
    return out


async def list_backends(request: web.Request) -> web.Response:
    gw = _gw(request)
    if not gw.auth.is_admin(request):
        return _forbidden()
    return web.json_response({"backends": backends_view(gw), "boxes": boxes_view(gw.backends, time.monotonic())})


def _unit(gw: OpsGateway, name: str) -> web.Response | None:
    if name not in gw.backends and not gw.fleet.managed(name):
        return _not_found(f"no backend {name!r}")
    if not gw.fleet.managed(name):
        return web.json_response({"error": {"type": "invalid_request_error",
                                            "message": f"backend {name!r} is not managed (it has no run: section)"}},
                                 status=409)
    return None


def _on_managed(action: Callable[[web.Request, OpsGateway, str], web.Response]):
    """A handler for /admin/backends/{name}/...: the admin key, then a managed backend by that
    name (404 for none, 409 for an external one), then `action`."""

    async def handler(request: web.Request) -> web.Response:
        gw = _gw(request)
        if not gw.auth.is_admin(request):
            return _forbidden()
        name = request.match_info["name"]
        refused = _unit(gw, name)
        if refused is not None:
            return refused
        return action(request, gw, name)

    handler.__name__ = handler.__qualname__ = action.__name__
    return handler


@_on_managed
def backend_log(request: web.Request, gw: OpsGateway, name: str) -> web.Response:
    try:
        n = max(1, min(int(request.query.get("lines", "200")), 100_000))
    except ValueError:
        return web.json_response({"error": {"type": "invalid_request_error",
                                            "message": "lines: expected an integer"}}, status=400)
    lines = gw.fleet.units[name].log.tail(n)
    return web.Response(text="".join(line + "\n" for line in lines), content_type="text/plain")


@_on_managed
def backend_start(request: web.Request, gw: OpsGateway, name: str) -> web.Response:
    return web.json_response(gw.fleet.want(name), status=202)


@_on_managed
def backend_stop(request: web.Request, gw: OpsGateway, name: str) -> web.Response:
    return web.json_response(gw.fleet.unwant(name), status=202)


def add_routes(app: web.Application, gw: OpsGateway) -> None:
    app[OPS_GATEWAY] = gw
    app.router.add_get("/admin/backends", list_backends)
    app.router.add_get("/admin/backends/{name}/log", backend_log)
    app.router.add_post("/admin/backends/{name}/start", backend_start)
    app.router.add_post("/admin/backends/{name}/stop", backend_stop)
    app.router.add_get("/admin/requests", list_requests)
    app.router.add_post("/admin/requests/{rid}/cancel", cancel_request)
    app.router.add_post("/admin/reload", reload_config)
