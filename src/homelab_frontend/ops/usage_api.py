"""Usage from the ledger over HTTP: `GET /admin/usage` (the admin key: every key's rows) and
`GET /llm/v1/usage` (a client key: its own rows only; naming another key is a 403).

    ?key=&model=&since=&until=&by=hour|day

`since`/`until` are ISO 8601 (no zone: UTC) or Unix seconds; rows whose hour starts in
[since floored to the hour, until) are summed per key x model x UTC hour or day. Answer:
`{"rows": [{"key", "model", "start", "start_unix", "requests", "input_tokens", "cached_tokens",
"output_tokens", "slot_seconds", ...}], "budgets": [...]}` (usage/rollup.py has every figure).
"""

from __future__ import annotations

import logging

from aiohttp import web

from ..errors import GatewayError
from ..usage.windows import parse_time
from .context import gateway as _gw

log = logging.getLogger("homelab_frontend")


def _error(status: int, kind: str, message: str, param: str | None = None) -> web.Response:
    # the OpenAI error shape: /llm/v1/usage sits among the OpenAI endpoints
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": None}},
                             status=status)


def _params(request: web.Request) -> dict:
    q = request.query
    out: dict = {"key": q.get("key") or None, "model": q.get("model") or None}
    for name in ("since", "until"):
        raw = q.get(name)
        if raw:
            try:
                out[name] = parse_time(raw)
            except ValueError as err:
                raise GatewayError("invalid_request", f"{name}: {err}", param=name) from None
    by = q.get("by") or "hour"
    if by not in ("hour", "day"):
        raise GatewayError("invalid_request", f"by: must be hour or day, got {by!r}", param="by")
    out["by"] = by
    return out


async def _answer(request: web.Request, only_key: str | None) -> web.Response:
    gw = _gw(request)
    ledger = gw.usage
    if ledger is None:
        return _error(404, "not_found_error", "the usage ledger is off (usage.enabled: false)")
    try:
        params = _params(request)
    except GatewayError as err:
        return _error(400, "invalid_request_error", err.message, err.param)
    if only_key is not None:
        if params["key"] is not None and params["key"] != only_key:
            return _error(403, "permission_error", "a key may read only its own usage", "key")
        params["key"] = only_key
    try:
        rows = await ledger.query(**params)
        budgets = await ledger.budget_status(params["key"])
    except GatewayError as err:
        return _error(err.status, "api_error", err.message)
    except Exception as err:  # the store failed (a disk error, Redis gone): said, not a stack trace
        log.warning("usage ledger: query failed: %s", err)
        return _error(503, "api_error", f"the usage ledger cannot be read now: {type(err).__name__}")
    return web.json_response({"rows": rows, "budgets": budgets})


async def admin_usage(request: web.Request) -> web.Response:
    if not _gw(request).auth.is_admin(request):
        return web.json_response({"error": {"type": "authentication_error", "message": "admin key required"}},
                                 status=401)
    return await _answer(request, None)


async def own_usage(request: web.Request) -> web.Response:
    try:
        principal = _gw(request).auth.authenticate(request)
    except GatewayError as err:
        return _error(401, "authentication_error", err.message)
    return await _answer(request, principal.name)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/usage", admin_usage)
