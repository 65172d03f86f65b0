"""Client connection hygiene (app/connguard.py), its policy on protocol objects: the cap closes
the oldest connection not inside a request, refuses only when every one is busy, and the head
deadline closes a connection whose request head does not arrive in time, re-armed for the next
request on a kept-alive connection. (tests/integration/test_client_connections.py drives the same
through a real gateway with raw sockets.)"""

from __future__ import annotations

import asyncio

from homelab_frontend.app.connguard import ConnectionGuard
from homelab_frontend.config import Connections


class _Transport:
    def __init__(self) -> None:
        self.closed = self.aborted = False

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class _Inner:
    """aiohttp's RequestHandler, as far as the wrapper talks to it."""

    def __init__(self) -> None:
        self.events: list = []

    def connection_made(self, t) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(data)

    def connection_lost(self, exc) -> None:
        self.events.append("lost")


def _open(guard: ConnectionGuard):
    inner = _Inner()
    g = guard.protocol_factory(lambda: inner)()
    t = _Transport()
    g.connection_made(t)
    return g, inner, t


def test_the_cap_evicts_the_oldest_idle_then_refuses_when_all_are_busy():
    async def main():
        guard = ConnectionGuard(Connections(max_connections=2, head_timeout_s=30))
        a, a_inner, a_t = _open(guard)
        b, _, b_t = _open(guard)
        a.request_started()  # a is inside a request: never the one closed
        c, c_inner, c_t = _open(guard)  # third: b, the oldest not busy, makes room
        assert b_t.closed and not a_t.closed and not c_t.aborted and c_inner.events == ["made"]
        b.connection_lost(None)
        c.request_started()
        d, d_inner, d_t = _open(guard)  # every open connection is busy: refused
        assert d_t.aborted and d_inner.events == []
        d.connection_lost(None)  # a refused connection was never handed to aiohttp
        assert d_inner.events == [] and len(guard.open) == 2
        a.busy = False  # a's request ended: it may be evicted now
        e, _, e_t = _open(guard)
        assert a_t.closed and not e_t.aborted
        for g in (a, c, e):
            g.connection_lost(None)
        assert guard.open == {} and guard._by_handler == {}

    asyncio.run(main())


def test_the_head_deadline_closes_a_silent_connection_and_rearms_for_the_next_request():
    async def main():
        guard = ConnectionGuard(Connections(max_connections=10, head_timeout_s=0.05))
        silent, _, silent_t = _open(guard)
        talking, inner, talking_t = _open(guard)
        talking.data_received(b"GET / HTTP/1.1\r\n")
        talking.request_started()  # the head is complete: the deadline no longer applies
        await asyncio.sleep(0.2)
        assert silent_t.closed and not talking_t.closed
        assert inner.events == ["made", b"GET / HTTP/1.1\r\n"]
        talking.busy = False  # the request ended; the connection is kept alive
        talking.data_received(b"GET /next")  # the next request's first bytes: the deadline again
        await asyncio.sleep(0.2)
        assert talking_t.closed
        for g in (silent, talking):
            g.connection_lost(None)

    asyncio.run(main())


def test_the_middleware_marks_a_connection_busy_for_the_request():
    async def main():
        guard = ConnectionGuard(Connections(max_connections=10, head_timeout_s=30))
        g, inner, _ = _open(guard)
        seen = []

        class _Req:
            protocol = inner

        async def handler(request):
            seen.append(g.busy)
            return "answer"

        assert await guard.middleware(_Req(), handler) == "answer"
        assert seen == [True] and not g.busy and g.timer is None

        class _Other:
            protocol = object()  # not a guarded connection (e.g. a test client): passed through

        assert await guard.middleware(_Other(), handler) == "answer"
        g.connection_lost(None)

    asyncio.run(main())
