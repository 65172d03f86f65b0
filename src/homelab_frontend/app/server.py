"""Builds the gateway: its live state, the routes, start-up, reload and graceful shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import sys
import time
import traceback
from typing import Awaitable, Callable, TypeVar

from aiohttp import web

from .. import config as cfgmod
from ..upstream import backend_kind
from ..policy import limits
from ..policy.auth import Auth
from .connguard import ConnectionGuard, GuardedServer
from ..errors import GatewayError
from ..request.exchange import Principal, client_gone
from ..ops import health
from ..ops.accesslog import AccessLog
from ..ops.metrics import Metrics
from ..policy.routing import BackendState, Router
from ..admission.slots import SlotPool
from ..surfaces.openai import handler as openai_surface
from ..surfaces.openai import errors as openai_errors
from ..surfaces.anthropic import errors as anthropic_errors
from ..surfaces.anthropic import handler as anthropic_surface
from ..surfaces.signature import ThinkingSigner
from ..surfaces.responses import errors as responses_errors
from ..surfaces.responses import handler as responses_surface
from ..request.tracker import Tracked, Tracker, new_request_id
from ..upstream.client import UpstreamClient

log = logging.getLogger("homelab_frontend")
GATEWAY = web.AppKey("gateway", object)
T = TypeVar("T")
OFF_LOOP_BYTES = 1 << 20  # bodies from this size on are parsed off the event loop

Handler = Callable[[web.Request, "Gateway", Tracked], Awaitable[web.StreamResponse]]


def _pool(name: str, b: cfgmod.Backend, cluster=None) -> SlotPool:
    if cluster is not None:  # replicas share the slots through Redis (slots_redis)
        return cluster.pool(name, b.slots, b.queue.depth, b.queue.timeout_s)
    return SlotPool(name, b.slots, b.queue.depth, b.queue.timeout_s)


class Gateway:
    """Everything a request handler needs, and what survives a config reload."""

    def __init__(self, cfg: cfgmod.Config, config_path: str | None = None) -> None:
        self.config_path = config_path
        self.tracker = Tracker()
        self.backends: dict[str, BackendState] = {}
        self.clients: dict[str, UpstreamClient] = {}
        self.access_log = AccessLog(cfg.access_log)
        secret = os.environ.get(cfg.anthropic.signing_key_env or "") if cfg.anthropic.signing_key_env else None
        self.signer = ThinkingSigner(secret.encode() if secret else None)
        self.metrics = Metrics(self)
        self.connguard: ConnectionGuard | None = None  # set by build_app
        self.cluster = None  # slots_redis.Registry when a `cluster:` section shares slots via Redis
        if cfg.cluster is not None:
            from ..ops.cluster import attach  # imports redis: only when a cluster is configured

            self.cluster = attach(self, cfg.cluster)
        self.draining = False  # SIGTERM received: new requests are refused, running ones finish
        self._probes: dict[str, asyncio.Task] = {}
        self._kicked: dict[str, asyncio.Task] = {}
        self._retiring: set[asyncio.Task] = set()
        self.apply(cfg)
        self.responses = responses_surface.State(self)  # reasoning sealer and the response store

    # -- configuration ------------------------------------------------------------------------

    def apply(self, cfg: cfgmod.Config) -> None:
        """Swap in a validated config. Pools live on (held slots stay accounted); requests in
        flight keep the route they resolved; new requests see the new table."""
        auth = Auth(cfg.auth)  # raises ConfigError before anything changes
        auth.inherit(getattr(self, "auth", None))
        for name, b in cfg.backends.items():
            state = self.backends.get(name)
            if state is None:
                state = self.backends[name] = BackendState(name, backend_kind.effective(b, None),
                                                           _pool(name, b, self.cluster))
            else:
                state.cfg = backend_kind.effective(b, state.detected_kind)
                state.pool.resize(b.slots, b.queue.depth, b.queue.timeout_s)
            state.auto_kind = b.kind is None
            old = self.clients.get(name)
            if old is None or old.cfg.url != b.url or old.cfg.api_key_env != b.api_key_env or old.cfg.timeouts != b.timeouts:
                if old is not None:
                    self._retire(name, old)
                self.clients[name] = UpstreamClient(name, b)
            else:
                old.cfg = b
        for name in list(self.backends):
            pool = self.backends[name].pool
            if name not in cfg.backends and pool.in_use == 0 and pool.queued == 0:
                del self.backends[name]  # still-busy removed backends linger until idle
                old = self.clients.pop(name, None)
                if old is not None:
                    self._retire(name, old)
        if hasattr(self, "cfg") and cfg.cluster != self.cfg.cluster:
            log.warning("cluster: changes to the cluster section take effect at the next restart")
        self.cfg = cfg
        self.auth = auth
        self.router = Router(cfg, self.backends)
        if _loop_running():
            self.start_probes()

    def reload(self) -> list[str]:
        """Re-read the config file. -> problems (empty when applied)."""
        if not self.config_path:
            return ["no config file to reload (started without --config)"]
        new_log = None
        try:
            cfg = cfgmod.load(self.config_path)
            try:
                new_log = AccessLog(cfg.access_log)  # reopened: logrotate's postrotate sends SIGHUP
            except OSError as err:
                raise cfgmod.ConfigError([f"access_log: cannot open {cfg.access_log!r}: {err.strerror}"]) from None
            self.apply(cfg)
        except cfgmod.ConfigError as err:
            if new_log is not None:
                new_log.close()
            log.warning("reload rejected, old config stays: %s", "; ".join(err.problems))
            self.metrics.reloaded(False)
            return err.problems
        old_log, self.access_log = self.access_log, new_log
        old_log.close()
        self.metrics.reloaded(True)
        log.info("config reloaded from %s", self.config_path)
        return []

    def _retire(self, name: str, old: UpstreamClient) -> None:
        """Close a replaced upstream client once the requests that may be streaming through it
        are done: closing it at once would cut their streams off mid-answer."""
        if not _loop_running():
            return  # no event loop yet: the client has opened no session
        users = [t for t in self.tracker if t.backend == name]
        task = asyncio.get_running_loop().create_task(self._close_when_done(old, users))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_when_done(self, old: UpstreamClient, users: list[Tracked]) -> None:
        try:
            while any(self.tracker.get(t.id) is t for t in users):
                await asyncio.sleep(0.25)
        finally:
            await old.close()

    # -- helpers for the surfaces -------------------------------------------------------------

    async def read_body(self, request: web.Request) -> bytes:
        # Read here rather than by aiohttp's client_max_size, so a reloaded limit applies.
        limit = self.cfg.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise GatewayError("request_too_large", f"the body is {request.content_length} bytes; "
                               f"the limit is {limit} (limits.max_body_bytes)")
        chunks, size = [], 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise GatewayError("request_too_large", f"the body is larger than the limit of {limit} bytes "
                                   "(limits.max_body_bytes)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def parse(self, body: bytes, parse: Callable[[bytes], T]) -> T:
        """The limits check and the dialect's parse of a request body. A large body is handled
        on a worker thread: its decode and depth walk take long enough (seconds, for megabytes
        of tiny arrays) that on the event loop they would stall every running stream."""

        def work() -> T:
            limits.check_json(body, self.cfg.limits)
            return parse(body)

        if len(body) < OFF_LOOP_BYTES:
            return work()
        return await asyncio.to_thread(work)

    def headers(self, t: Tracked) -> dict[str, str]:
        return {"request-id": t.id, "server-timing": server_timing(t)}

    def hold(self, principal: Principal):
        return self.auth.hold(principal)

    def observe(self, t: Tracked, path: str) -> None:
        self.access_log.write(t, path)
        if self.metrics is not None:
            self.metrics.observe(t)
        if t.outcome == "error_upstream_unreachable" and t.backend is not None:
            self._kick_probe(t.backend)

    def _kick_probe(self, name: str) -> None:
        """Probe now (once at a time): a failed connect marks the backend down only when the
        probe agrees, so one dropped keep-alive connection cannot take a backend out."""
        task = self._kicked.get(name)
        if name in self.backends and (task is None or task.done()) and _loop_running():
            self._kicked[name] = asyncio.get_running_loop().create_task(self.probe(name))

    # -- backend health -----------------------------------------------------------------------

    def start_probes(self) -> None:
        for name in list(self._probes):
            if name not in self.backends:
                self._probes.pop(name).cancel()
        for name in self.backends:
            if name not in self._probes or self._probes[name].done():
                self._probes[name] = asyncio.get_running_loop().create_task(self._probe_loop(name))

    async def probe(self, name: str) -> None:
        state = self.backends.get(name)
        client = self.clients.get(name)
        if state is not None and client is not None:
            await health.probe(state, client)

    async def _probe_loop(self, name: str) -> None:
        while name in self.backends:
            if name not in self.cfg.backends:  # removed by a reload while still busy
                pool = self.backends[name].pool
                if pool.in_use == 0 and pool.queued == 0:
                    del self.backends[name]
                    old = self.clients.pop(name, None)
                    if old is not None:
                        await old.close()
                    return
                await asyncio.sleep(0.5)
                continue
            await self.probe(name)
            await asyncio.sleep(self.backends[name].cfg.health_interval_s if name in self.backends else 1)

    async def close(self) -> None:
        for task in [*self._probes.values(), *self._kicked.values()]:
            task.cancel()
        retiring = list(self._retiring)
        for task in retiring:
            task.cancel()  # its `finally` closes the old client
        await asyncio.gather(*retiring, return_exceptions=True)
        for client in self.clients.values():
            await client.close()
        await self.responses.close()
        if self.cluster is not None:
            await self.cluster.close()  # gives back any slot still held, then disconnects


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


# -- surfaces ---------------------------------------------------------------------------------


def surface(dialect: str, fn: Handler):
    render = {"anthropic": anthropic_errors.render_error,
              "responses": responses_errors.render_error}.get(dialect, openai_errors.render_error)

    async def handler(request: web.Request) -> web.StreamResponse:
        gw: Gateway = request.app[GATEWAY]
        t = Tracked(new_request_id(), dialect, "", None, False)
        gw.tracker.add(t)
        try:
            if gw.draining:
                raise GatewayError("overloaded", "the gateway is shutting down", status=503, retry_after=5)
            limits.check_headers(request, gw.cfg.limits)
            t.key_name = gw.auth.authenticate(request).name or None  # 401 before the body is read
            resp = await fn(request, gw, t)
            t.status = resp.status
            return resp
        except GatewayError as err:
            return _error_answer(request, t, err, render)
        except asyncio.CancelledError:
            own = t.own_cancel_error()
            if own is None:
                _client_left(t)
                raise
            return _error_answer(request, t, own, render)
        except Exception as exc:
            if isinstance(exc, ConnectionResetError) and client_gone(request):
                # A write to a client that already left, a moment before aiohttp cancels us.
                _client_left(t)
                raise asyncio.CancelledError() from None
            log.error("request %s failed:\n%s", t.id, traceback.format_exc())
            err = GatewayError("api_error", f"internal error in the gateway (request id {t.id})")
            return _error_answer(request, t, err, render)
        finally:
            gw.tracker.remove(t)
            key = request.get("principal_key")
            t.key_name = key.name if key is not None else None
            gw.observe(t, request.path)

    return handler


def _client_left(t: Tracked) -> None:
    t.outcome = f"cancelled_{t.phase}"
    t.status = 499  # nginx's "client closed request": nothing was sent


def _error_answer(request: web.Request, t: Tracked, err: GatewayError, render) -> web.Response:
    """The error in the caller's dialect, unless the answer has already begun on the wire (a
    stream that failed, or was cancelled by the gateway, while its last bytes were still being
    written to a client that stopped reading): aiohttp would then write the error response
    inside the first one's body. The connection is cut instead, the one signal left, and the
    access log keeps the status the client got (an answer begins only as a 200: every error
    before that is rendered whole)."""
    if request.writer.output_size:
        if t.outcome == "ok":
            t.outcome = f"error_{err.kind}"
        t.status = t.status or 200
        raise asyncio.CancelledError()
    return _error_response(t, err, render)


def _error_response(t: Tracked, err: GatewayError, render) -> web.Response:
    status, body, headers = render(err)
    t.status = status
    if t.outcome == "ok":
        t.outcome = f"rejected_{err.kind}" if err.kind in ("overloaded", "rate_limit") else f"error_{err.kind}"
    return web.Response(
        status=status, body=body, content_type="application/json",
        headers={**headers, "request-id": t.id, "server-timing": server_timing(t)},
    )


def server_timing(t: Tracked) -> str:
    """The `Server-Timing` header (ms), so a client can see what the gateway added to an answer:
    `queue` waiting for a slot, `upstream` from sending the upstream request to its response
    headers, `gw` the rest of the time until these headers (reading and parsing the request,
    routing, building the upstream body). Parts the request never reached are left out."""
    own = time.monotonic() - t.started
    parts = []
    if t.queue_wait is not None:
        parts.append(f"queue;dur={t.queue_wait * 1000:.3f}")
        own -= t.queue_wait
    if t.upstream_headers is not None:
        parts.append(f"upstream;dur={t.upstream_headers * 1000:.3f}")
        own -= t.upstream_headers
    parts.append(f"gw;dur={max(own, 0.0) * 1000:.3f}")
    return ", ".join(parts)


# -- small endpoints --------------------------------------------------------------------------


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
    from ..ops import admin, metrics

    admin.add_routes(app)
    metrics.add_routes(app)

    async def on_startup(app: web.Application) -> None:
        gw.start_probes()
        if gw.cluster is not None:
            await gw.cluster.start()  # first contact with Redis before the port opens

    async def on_cleanup(app: web.Application) -> None:
        await gw.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


# -- running ----------------------------------------------------------------------------------


async def serve(cfg: cfgmod.Config, config_path: str | None, host: str, port: int,
                ready: Callable[[int], None] | None = None) -> int:
    gw = Gateway(cfg, config_path)
    app = build_app(gw)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           max_field_size=limits.parser_field_cap(cfg.limits),
                           keepalive_timeout=cfg.connections.keepalive_timeout_s)
    await runner.setup()
    # every client connection's protocol goes through the guard (app/connguard.py)
    runner._server = GuardedServer(runner._server, gw.connguard)
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    if gw.auth.open:
        msg = "no client keys configured: the gateway is open to anyone who can reach it"
        if not _loopback(host):
            msg = f"WARNING: listening on {host} without client keys: anyone on the network can use your GPUs"
        log.warning(msg)
    print(f"homelab-frontend listening on http://{host}:{bound}", flush=True)
    if ready:
        ready(bound)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gw.reload)
    await stop.wait()

    # Graceful shutdown: stop accepting, let running requests finish, then cancel the rest.
    # A second SIGTERM / Ctrl-C skips what is left of the grace period.
    force = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, force.set)
    loop.add_signal_handler(signal.SIGINT, force.set)
    gw.draining = True  # requests on kept-alive connections are refused from here on
    log.warning("shutting down: %d requests in flight, up to %g s to finish", len(gw.tracker), gw.cfg.shutdown_grace_s)
    await site.stop()
    deadline = loop.time() + gw.cfg.shutdown_grace_s
    while len(gw.tracker) and loop.time() < deadline and not force.is_set():
        await asyncio.sleep(0.05)
    left = list(gw.tracker)
    if left:
        log.warning("shutdown: cancelling %d requests still running", len(left))
    for t in left:
        gw.tracker.cancel(t.id, "shutdown")
    for _ in range(100):
        if not len(gw.tracker):
            break
        await asyncio.sleep(0.02)
    await runner.cleanup()
    log.warning("shutdown complete")
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def run(cfg: cfgmod.Config, config_path: str | None, host: str, port: int) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    limits.quiet_parser_errors()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    try:
        if uvloop is not None:
            return uvloop.run(serve(cfg, config_path, host, port))
        return asyncio.run(serve(cfg, config_path, host, port))
    except cfgmod.ConfigError as err:
        for p in err.problems:
            print(p, file=sys.stderr)
        return 2
