"""Client connection hygiene: a deadline for a request head, and a cap on open connections.

aiohttp's own defaults let a connection that never completes its request line and headers (a
slowloris, or one that sends nothing at all) live for an hour, and nothing bounds how many there
are: a few hundred idle sockets exhaust the file descriptors and every real request fails. So
each client connection's protocol is wrapped (`_Guarded`, a pass-through asyncio protocol in
front of aiohttp's RequestHandler) to enforce, from `connections:` in the config:

* `head_timeout_s`: from a connection's first moment, and from the first byte of each later
  request on a kept-alive connection, the whole request head must arrive within this, or the
  connection is closed. The deadline stops when a request reaches the application (the
  middleware marks the connection busy); a slow request *body* is the handler's concern.
* `keepalive_timeout_s`: aiohttp's keep-alive timer (passed to the runner by app/serve.py) closes a
  connection idle between requests.
* `max_connections`: when a new connection would exceed it, the oldest connection not inside a
  request (idle, or still sending its head) is closed to make room; only when every connection
  is busy with a request is the new one refused. Either way one log line says so (at most every
  10 s), so an operator can tell a flood from a slow backend.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, Callable

from aiohttp import web

from ..config import Connections

log = logging.getLogger("homelab_frontend")
_LOG_EVERY_S = 10.0
_FD_HEADROOM = 128  # descriptors kept for upstream connections, the access log, Redis


class ConnectionGuard:
    def __init__(self, cfg: Connections) -> None:
        self.cfg = cfg
        self.max_connections = _fit_fd_limit(cfg.max_connections)
        self.open: dict[_Guarded, None] = {}  # insertion order: oldest first
        self._by_handler: dict[Any, _Guarded] = {}
        self._last_log = -_LOG_EVERY_S
        self._evicted = self._refused = 0

    def protocol_factory(self, inner_factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, inner_factory())

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        g = self._by_handler.get(request.protocol)
        if g is None:
            return await handler(request)
        g.request_started()
        try:
            return await handler(request)
        finally:
            g.busy = False

    # -- admission ----------------------------------------------------------------------------

    def admit(self, g: "_Guarded") -> bool:
        if len(self.open) >= self.max_connections:
            victim = next((c for c in self.open if not c.busy and not c.closing), None)
            if victim is None:
                self._refused += 1
                self._report("every one is inside a request: refusing new connections")
                return False
            self._evicted += 1
            self._report("closing the oldest idle ones to make room")
            victim.close()
        self.open[g] = None
        self._by_handler[g.inner] = g
        return True

    def forget(self, g: "_Guarded") -> None:
        self.open.pop(g, None)
        self._by_handler.pop(g.inner, None)

    def _report(self, what: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning("client connections: the limit of %d open connections is reached "
                        "(connections.max_connections); %s (so far %d closed, %d refused)",
                        self.max_connections, what, self._evicted, self._refused)


def _fit_fd_limit(wanted: int) -> int:
    """The connection cap must leave file descriptors for everything else: raise the process's
    soft limit as far as the hard one allows, else lower the cap (and say so)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + _FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(1, soft - _FD_HEADROOM)
        log.warning("connections.max_connections: %d does not fit the open-file limit of %d; using %d",
                    wanted, soft, fitted)
        return fitted
    return wanted


class _Guarded(asyncio.Protocol):
    """Passes every protocol event on to aiohttp's handler, watching the request head's deadline."""

    __slots__ = ("guard", "inner", "transport", "busy", "timer", "admitted")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = False  # inside a request (the head is complete)
        self.timer: asyncio.TimerHandle | None = None
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            transport.abort()  # type: ignore[attr-defined]
            return
        self.admitted = True
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.busy and self.timer is None:
            self._arm()  # the first byte of the next request on a kept-alive connection
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.admitted:
            self.guard.forget(self)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the head deadline --------------------------------------------------------------------

    def request_started(self) -> None:
        self.busy = True
        self._disarm()

    @property
    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():  # not self.closing, spelled out for mypy
            transport.close()

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.cfg.head_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if not self.busy:
            self.close()


class GuardedServer:
    """aiohttp's low-level Server with each connection's protocol wrapped (see above)."""

    def __init__(self, server: web.Server, guard: ConnectionGuard) -> None:
        self._server = server
        self._factory = guard.protocol_factory(server)

    def __call__(self) -> asyncio.Protocol:
        return self._factory()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)
