"""Running the gateway: bind, announce, handle signals (SIGHUP reloads), drain on shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import sys
from typing import Callable

from aiohttp import web

from .. import config as cfgmod
from ..policy import limits
from .connguard import GuardedServer
from .gateway import Gateway
from .routes import build_app

log = logging.getLogger("homelab_frontend")


class StartupError(Exception):
    """The gateway cannot start (its port is taken, its config is invalid): said in one line."""


def fail(message: str) -> int:
    """A start-up failure: one line on stderr, exit status 2 (as for a bad command line)."""
    print(f"homelab-frontend: {message}", file=sys.stderr, flush=True)
    return 2


async def serve(cfg: cfgmod.Config, config_path: str | None, host: str, port: int,
                ready: Callable[[int], None] | None = None) -> int:
    check_port(host, port)  # before anything starts: probes, managed servers, the ledger
    gw = Gateway(cfg, config_path)
    app = build_app(gw)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           max_field_size=limits.parser_field_cap(cfg.limits),
                           keepalive_timeout=cfg.connections.keepalive_timeout_s)
    try:
        await runner.setup()  # runs Gateway.start: the ledger may refuse its file
    except cfgmod.ConfigError:
        await gw.close()  # the probes and sessions the constructor opened
        raise
    # every client connection's protocol goes through the guard (app/connguard.py)
    server, guard = runner._server, gw.connguard
    assert server is not None and guard is not None  # runner.setup() made one, build_app the other
    # GuardedServer stands in for aiohttp's Server (it delegates every other attribute to it); the
    # runner only calls it as the protocol factory, which aiohttp does not declare as a type
    runner._server = GuardedServer(server, guard)  # type: ignore[assignment]
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    try:
        await site.start()
    except OSError as err:
        # Closes what start-up opened (probes, upstream sessions, Redis) before saying why.
        await runner.cleanup()
        why = os.strerror(err.errno).lower() if err.errno else str(err)  # asyncio's text repeats the address
        raise StartupError(f"cannot listen on {host}:{port}: {why}") from None
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


def check_port(host: str, port: int) -> None:
    """A port another process holds is said before the gateway starts anything: a health probe's
    warning (or a managed server started at boot) would otherwise come first. Bound and let go at
    once, with the options the site binds with; a port taken between this and the real bind is
    still reported by the bind itself."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # the real bind says what is wrong with the host
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as err:
                why = os.strerror(err.errno).lower() if err.errno else str(err)
                raise StartupError(f"cannot listen on {host}:{port}: {why}") from None


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
        uvloop = None  # type: ignore[assignment]  # optional: asyncio's own loop then
    try:
        if uvloop is not None:
            return uvloop.run(serve(cfg, config_path, host, port))
        return asyncio.run(serve(cfg, config_path, host, port))
    except cfgmod.ConfigError as err:
        return fail(f"invalid config: {'; '.join(err.problems)}")
    except StartupError as err:
        return fail(str(err))
