"""One request's hold on the cluster: a slot, an upstream response, and a watchdog over both.

Cancellation is structural. The request's handler task owns the Exchange; whatever ends the task
(the client going away, which aiohttp turns into a cancellation at once; a timeout; an operator's
cancel; shutdown), `__aexit__` closes the upstream connection (the upstream aborts its generation
when its socket closes) and returns the slot. Nothing waits for a next chunk to notice.

Timeouts and keep-alive pings are watched by a timer per request that looks at a progress counter
a few times a second, so the per-chunk cost of all of it is one integer increment. When a deadline
passes it cancels the handler task with a reason; the surface turns that reason into an error in
its dialect (`own_cancel`), while a cancellation with no reason is the client leaving. The timer is
a plain `call_later` handle, not a task: a task per request (created, woken, cancelled) cost more
than everything else the exchange does, and a task is started only to write a ping.

When a slot counts as released (bench/storm.py measures it): a slot stands for a sequence the
upstream runs, so an aborted exchange gives its slot back only once the upstream can have seen
the abort: when our side of the old connection is really closed (with uvloop the socket is
closed in a later loop phase than `close()` is called; a request granted the slot meanwhile went
out on a pooled connection *before* the old one's FIN) and `RELEASE_GRACE_S` after that, the time
for the upstream to process its end. Capped by `SETTLE_MAX_S`. An exchange read to its end gives
its slot back at once: the upstream finished that sequence before it sent the last byte. The
gateway's own cancels (`own_cancel`: a timeout, the admin API) free the slot at once as before,
since their error is still to be written to a client that may not read it.

Failover (request/failover.py has the causes): `attempt` runs the opening of the upstream answer;
when the backend fails it before answering in a way another backend may not, the slot goes back
at once (nothing runs there) and a slot on another backend of the model is taken through the fair
queue, the deadlines running on. Each backend is tried once. The same place feeds passive health
(policy/passive_health.py): a connection failure counts against the backend, an answer clears it.

The prompt count (`count_prompt`): where the upstream reports the prompt's size only at the end
of its answer (llama.cpp, Ollama) or never (a generation the gateway stopped itself, at a stop
string it matched), the exact figure comes from the backend's tokenizer (upstream/prompt_count.py).
The count is a task the exchange owns, started as soon as the upstream body exists and run beside
the upstream call, so it costs no time to first token; leaving the exchange cancels it with the
upstream response. `prompt_tokens` is the count once it arrived (None before, or without a
tokenizer); `counted_prompt()` waits for it, bounded.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar, cast

import aiohttp
import msgspec
from aiohttp import web

from ..admission.lease import Lease
from ..admission.slots import SlotStore
from ..errors import GatewayError
from ..policy.auth import ANONYMOUS, PERSON_HEADER, Principal
from ..policy.routing import BackendState, Route
from .tracker import Tracked
from ..upstream.client import StreamedBody, UpstreamClient, UpstreamFailure
from ..upstream.prompt_count import can_count, count_prompt
from . import drain, failover

T = TypeVar("T")

RELEASE_GRACE_S = 0.02  # after our end of an aborted upstream connection is closed
SETTLE_MAX_S = 0.25  # longest an aborted exchange waits for that before its slot is given back


class Exchange:
    def __init__(
        self,
        tracked: Tracked,
        route: Route,
        clients: dict[str, UpstreamClient],
        principal: Principal = ANONYMOUS,
        session: str | None = None,
    ) -> None:
        self.t = tracked
        self.session = session  # the conversation's key, for session affinity (policy/affinity.py)
        self.route = route
        self.clients = clients
        self.principal = principal
        tracked.key_name = principal.name or None  # the key's name, shown while it runs
        tracked.served_model = route.model
        self.backend: BackendState | None = None
        self.resp: aiohttp.ClientResponse | None = None
        self.client: UpstreamClient | None = None  # the backend's client, once open
        self.progress = 0  # bumped by the reader per upstream batch; the watchdog reads it
        self.complete = False  # the upstream answer was read to its end
        self.writing = False  # inside send(): see there
        self.on_idle: Callable[[], Awaitable[None]] | None = None
        self.ping_interval: float | None = None
        self._held_since: float | None = None
        self._lease: Lease | None = None  # the slot held (admission/lease.py): given back exactly once
        self._opened = False  # an upstream request was started (a connection may exist)
        self._watch: _Watchdog | None = None
        self._count: asyncio.Task[int | None] | None = None  # the prompt count, see count_prompt
        self._posting: asyncio.Task[aiohttp.ClientResponse] | None = None  # on_client_gone drain: the upstream request, until it answers
        self._loop = asyncio.get_running_loop()

    # -- phases -------------------------------------------------------------------------------

    async def admit(self) -> BackendState:
        self.t.queued()
        pinned = self._pinned()
        try:
            backend, self.t.affinity = (pinned, None) if pinned is not None else self.route.place(self.session)
        except GatewayError:
            # every backend is down: the refusal is counted against the (first) one it would use
            self.t.backend = self.route.backends[0].name if self.route.backends else None
            raise
        await self._take(backend)
        return backend

    def _pinned(self) -> BackendState | None:
        """Through a front gateway (docs/several-boxes.md): the backend whose slot the front holds
        for this request, when it serves the route and is up (else the usual choice)."""
        pin = self.principal.pin
        if pin is None:
            return None
        return next((b for b in self.route.backends if b.name == pin and b.up), None)

    def _peer_headers(self) -> dict[str, str] | None:
        """To a peer box: whom the request is for (which backend of the peer's the slot is of
        goes with every request of that backend's client: app/peers.py)."""
        link = self.backend.peer if self.backend is not None else None
        if link is None or not self.principal.name:
            return None
        return {PERSON_HEADER: self.principal.name}

    async def _take(self, backend: BackendState) -> None:
        """A slot on `backend`, through its fair queue."""
        self.t.queued()
        self.backend = backend
        self.t.backend = backend.name
        waited = self.t.queue_wait or 0.0  # a failover's second wait adds to the first
        self.t.upstream_model = self.route.upstream_model
        t0 = time.monotonic()
        try:
            # the key's priority and the model's (config.Model.priority: completions before agents)
            self._lease = await _store(backend).acquire(self.principal.name,
                                                        self.principal.priority + self.route.priority, self.t)
        except GatewayError:
            # refused (queue full, or no slot within the queue's timeout): how long it waited is
            # still what the client wants to know (Server-Timing), and the operator (access log)
            self.t.queue_wait = waited + time.monotonic() - t0
            raise
        self._held_since = now = time.monotonic()
        self.t.queue_wait = waited + now - t0

    async def attempt(self, opener: Callable[[], Awaitable[T]]) -> T:
        """`opener()` opens the upstream answer on `self.backend`; when that backend fails it
        before answering and another backend may answer instead (request/failover.py), the
        request moves there and `opener` runs again. The last failure is raised when no backend
        is left to try."""
        while True:
            try:
                return await opener()
            except UpstreamFailure as err:
                cause = failover.cause_of(err)
                if cause is None or not await self._fail_over(cause):
                    raise

    async def whole(self, read: Callable[[], Awaitable[T]]) -> T:
        """A whole answer read from an upstream stream: `read()` opens it and reads it to its end,
        raising UpstreamFailure(cause="broke") when the backend breaks off mid-way. No byte of a
        whole answer reaches the client before its end, so such a backend fails over like one
        that refused (`attempt`): the partial answer and its counts are dropped and the request
        is answered whole by another backend of the model."""
        t = self.t

        async def once() -> T:
            t.tokens_out, t.tokens_in, t.tokens_cached = 0, None, None
            return await read()

        return await self.attempt(once)

    async def _fail_over(self, cause: str) -> bool:
        failed = self.backend
        assert failed is not None
        if cause == "broke":  # its connection died under the answer: as good as refused for health
            failed.connection_failed(f"backend {failed.name!r} broke off an answer")
        tried = self.t.tried()
        alt = self.route.alternative(tried, failed)
        if alt is None:
            return False
        self.t.failovers = [*(self.t.failovers or ()), (failed.name, cause)]
        if self.resp is not None:  # the answer it broke off (a whole one: none of it went out)
            self.resp.close()
            self.resp = None
        self._opened = self.complete = False
        self._release_slot()  # it refused, never answered, or died: nothing runs there
        if self._count is not None:  # the next backend's own tokenizer counts the prompt anew
            self._count.cancel()
            self._count = None
        await self._take(alt)
        return True

    async def open(self, path: str, body: bytes | StreamedBody, *, stream: bool, root: bool = False,
                   headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        """POST `body` to the backend's `path` (under its /v1 base URL; `root`: under its root,
        for llama.cpp's own endpoints such as /infill). `headers`: a relayed body's own (an
        upload's content type and length)."""
        assert self.backend is not None
        self.t.connecting()
        if self._watch is None:
            self._watch = _Watchdog(self, stream)
        client = self.client = self.clients[self.backend.name]
        self._opened = True
        t0 = time.monotonic()
        try:
            trace = self.t.trace
            peer = self._peer_headers()
            if peer is not None:
                headers = {**(headers or {}), **peer}
            if trace is not None:
                headers = {**(headers or {}), **trace.upstream_headers()}
            posting = (client.post(path, body, root=root) if headers is None
                       else client.post(path, body, root=root, headers=headers))
            if self.backend.cfg.on_client_gone == "drain":
                # the request stays on its way even when this task is cancelled before the
                # answer's headers (a whole answer's come at its end): drain.py reads it then
                pending = self._posting = self._loop.create_task(posting)
                try:
                    self.resp = resp = await asyncio.shield(pending)
                finally:
                    if pending.done():  # answered or failed: nothing left on its way
                        self._posting = None
            elif self.backend.peer is not None and self.backend.peer.backend:
                self.resp = resp = await _unless_box_down(self.backend, posting)
            else:
                self.resp = resp = await posting
        except GatewayError as err:
            self._opened = False  # it answered (an error) or never connected: nothing runs there
            if not isinstance(err, UpstreamFailure):
                pass  # the client's own fault mid-upload (a StreamedBody's failure): says nothing of the backend
            elif err.cause in failover.CONNECTION_CAUSES:
                self.backend.connection_failed(err.message)
            else:
                self.backend.passive.answered(False)
            raise
        self.backend.passive.answered(True)
        self.t.upstream_headers = time.monotonic() - t0
        self.t.answering(stream)
        return resp

    async def send(self, out: web.StreamResponse, data: bytes) -> None:
        """Write to the client. While the write waits for a client that does not read, the
        silence upstream is the client's doing, and the watchdog must not blame the backend."""
        self.writing = True
        await out.write(data)
        self.writing = False

    def first_token(self) -> None:
        self.t.streaming()
        self.t.ttft = time.monotonic() - self.t.started

    # -- the prompt count, beside the upstream call ------------------------------------------

    def count_prompt(self, payload: bytes) -> bool:
        """Start counting the prompt of `payload` (the upstream chat body) with the backend's
        tokenizer, unless it has none or a count already runs. -> whether a count runs."""
        assert self.backend is not None
        if self._count is not None:
            return True
        cfg = self.backend.cfg
        kind = cfg.kind
        if kind is None or not can_count(kind):  # not yet probed: no tokenizer known
            return False
        client = self.clients[self.backend.name]
        timeout_s = min(10.0, cfg.timeouts.first_token_s)

        async def count() -> int | None:
            return await count_prompt(client, kind, msgspec.json.decode(payload), timeout_s=timeout_s)

        self._count = self._loop.create_task(count())
        return True

    @property
    def prompt_tokens(self) -> int | None:
        """The backend tokenizer's count of the prompt, once it has arrived; else None."""
        task = self._count
        if task is None or not task.done() or task.cancelled():
            return None
        return task.result()  # count_prompt turns every failure into None

    def prompt_tokens_or(self, fallback: int) -> Callable[[], int]:
        """A function giving the count when it has arrived, else `fallback` (an estimate): for a
        figure written at a moment the caller does not choose (Anthropic's message_start)."""
        return lambda: p if (p := self.prompt_tokens) is not None else fallback

    async def counted_prompt(self, timeout_s: float | None = None) -> int | None:
        """The prompt count, waited for (at most `timeout_s`); None without one."""
        task = self._count
        if task is None:
            return None
        if not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                return None
        return self.prompt_tokens

    # -- the end ------------------------------------------------------------------------------

    async def __aenter__(self) -> "Exchange":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._drains():
            self._detach_drain()
        if self.t.drain is not None:  # drain.py: its task gives the slot back once the answer ended
            return
        closed = self._let_go_upstream()
        if self._held_since is None or not (self._opened and not self.complete):
            self._release_slot()
            return
        try:  # an aborted exchange: its slot waits until the upstream can have seen the abort
            if closed is not None and not closed.done():
                await asyncio.wait((closed,), timeout=SETTLE_MAX_S)
            await asyncio.sleep(RELEASE_GRACE_S)
        finally:
            self._release_slot()

    def _drains(self) -> bool:
        """An upstream answer still running on a backend that must not be aborted (drain.py)."""
        b = self.backend
        return (b is not None and b.cfg.on_client_gone == "drain" and (self.resp is not None or self._posting is not None)
                and not self.complete and self._held_since is not None and self.t.drain is None)

    def _detach_drain(self) -> None:
        """Let the client go now; a task of its own reads the upstream answer to its end and
        then gives the slot back (drain.py). The request's record follows that task: an
        operator's cancel or shutdown (Tracker.cancel) then ends the drain."""
        assert self.backend is not None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._count is not None and not self._count.done():
            self._count.cancel()
        to = self.backend.cfg.timeouts
        resp = self.resp or self._posting
        assert resp is not None  # _drains() said one of them is there
        self.resp = self._posting = None
        t = self.t
        t.cancel_reason = None  # a cancel that ended the answer must not end the drain: a new one may
        task = self._loop.create_task(drain.drain(t, resp, to.idle_s, to.total_s or to.nonstream_s, self._release_slot))
        t.drain = t.task = task

    def close(self) -> None:
        """Idempotent and synchronous: it must run to the end even inside a cancellation."""
        if self.t.drain is not None:  # drain.py: its task gives the slot back once the answer ended
            return
        self._let_go_upstream()
        self._release_slot()

    def _let_go_upstream(self) -> asyncio.Future[None] | None:
        """Stop the watchdog, close (or pool) the upstream connection. -> a future set once our
        side of an aborted connection is really closed (None: nothing to wait for)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._count is not None and not self._count.done():
            self._count.cancel()  # its connection closes with it; nobody wants the figure now
        closed: asyncio.Future[None] | None = None
        if self.resp is not None:
            if self.complete:
                self.resp.release()  # read to the end: the connection goes back to the pool
            else:
                conn = self.resp.connection
                proto = conn.protocol if conn is not None else None
                fut = getattr(proto, "closed", None)  # aiohttp >= 3.10: set by connection_lost
                if isinstance(fut, asyncio.Future):
                    closed = fut
                    fut.add_done_callback(_retrieve)
                self.resp.close()  # abort: the upstream sees its socket close and stops
            self.resp = None
        return closed

    def _release_slot(self) -> None:
        if self._held_since is not None and self.backend is not None and self._lease is not None:
            held = time.monotonic() - self._held_since
            self._held_since = None
            self.t.slot_seconds += held
            lease, self._lease = self._lease, None
            _store(self.backend).release(lease, held)

    def own_cancel(self) -> GatewayError | None:
        """After a CancelledError: the gateway's own reason as an error (the caller then writes it
        to the client), or None when the client left. The upstream and the slot are let go first,
        so a client too slow to take the error frame holds neither while it is written."""
        err = self.t.own_cancel_error()
        if err is not None:
            if self._drains():  # never aborted, not even by the gateway (drain.py)
                self._detach_drain()
            else:
                self.close()
        return err

    async def drain(self, timeout_s: float = 0.5) -> None:
        """After the upstream's `[DONE]`: read the end of its body (the chunked terminator) so the
        keep-alive connection goes back to the pool instead of being closed. An upstream that
        does not end its body promptly just has its connection closed."""
        resp = self.resp
        if resp is None or resp.content.at_eof():
            return
        try:
            async with asyncio.timeout(timeout_s):
                while await resp.content.readany():
                    pass
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            self.complete = False


async def _unless_box_down(backend: BackendState, posting: Awaitable[aiohttp.ClientResponse]) -> aiohttp.ClientResponse:
    """A box's backend (docs/several-boxes.md): its answer's headers, unless the box stops
    answering its polls first (app/peers.mark_down). A box behind a link that accepts and says
    nothing (a black hole) would otherwise keep the request for its whole first_token_s; this
    way it fails over (cause `box_down`) at the poll's timeout. Nothing of the answer has reached
    the client: it is before the first byte."""
    assert backend.peer is not None
    down = backend.peer.went_down()
    task = asyncio.ensure_future(posting)
    waiter = asyncio.ensure_future(down.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request was cancelled (its client left, a deadline): nothing stays open
        waiter.cancel()
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            task.result().close()
        raise
    waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()  # the box went down first
    await asyncio.gather(task, return_exceptions=True)
    raise UpstreamFailure("upstream_unreachable", backend.last_error or f"backend {backend.name!r} is down with its box",
                          cause="box_down")


class _Watchdog:
    """Timeouts and pings for one exchange: a timer that re-arms itself every `tick`."""

    __slots__ = ("ex", "stream", "to", "total", "tick", "start", "seen", "last_change", "last_ping",
                 "handle", "pinging", "last_check")

    def __init__(self, ex: Exchange, stream: bool) -> None:
        assert ex.backend is not None
        to = self.to = ex.backend.cfg.timeouts
        self.ex = ex
        self.stream = stream
        self.total = to.total_s if to.total_s is not None else (None if stream else to.nonstream_s)
        limits = [x for x in (to.first_token_s, to.idle_s, self.total, ex.ping_interval) if x]
        self.tick = min(1.0, max(0.02, min(limits) / 4))
        self.start = self.last_change = self.last_ping = self.last_check = ex._loop.time()
        self.seen = 0
        self.pinging: asyncio.Task[None] | None = None
        self.handle: asyncio.TimerHandle | None = ex._loop.call_later(self.tick, self._check)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.pinging is not None:
            self.pinging.cancel()
            self.pinging = None

    def _check(self) -> None:
        ex, to, stream = self.ex, self.to, self.stream
        loop = ex._loop
        now = loop.time()
        if ex.progress != self.seen:
            self.seen, self.last_change, self.last_ping = ex.progress, now, now
        if self.seen == 0 and ex.backend is not None and ex.backend.loading:
            # a peer box loading the model (its report): the first-token clock stands still, as
            # a local managed backend's queue clock does while it starts (admission/slots.py)
            self.start += now - self.last_check
        self.last_check = now
        reason = None
        if self.total is not None and now - self.start > self.total:
            reason = f"the backend did not finish within {self.total:g} s"
        elif stream and self.seen == 0 and now - self.start > to.first_token_s:
            reason = f"no first token from the backend within {to.first_token_s:g} s"
        elif stream and self.seen > 0 and now - self.last_change > to.idle_s:
            if ex.writing:
                self.handle = None
                ex.t.cancel("client_stalled", f"the client stopped reading for more than {to.idle_s:g} s")
                return
            reason = f"the backend went silent for more than {to.idle_s:g} s mid-stream"
        if reason is not None:
            self.handle = None
            ex.t.cancel("timeout", reason)
            return
        if (ex.on_idle is not None and ex.ping_interval and now - self.last_ping >= ex.ping_interval
                and (self.pinging is None or self.pinging.done())):
            self.last_ping = now
            self.pinging = loop.create_task(self._ping(ex.on_idle))
        self.handle = loop.call_later(self.tick, self._check)

    @staticmethod
    async def _ping(on_idle: Callable[[], Awaitable[None]]) -> None:
        try:
            await on_idle()
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass  # the client is gone; the handler's own cancellation handles that


def _store(backend: BackendState) -> SlotStore:
    """The backend's slot store as admission defines it. routing.BackendState declares its pool
    by a Protocol of its own, below the admission layer, which cannot name a Lease; the pool is
    always one of admission's stores (app/ builds them), so this is a boundary between layers."""
    return cast(SlotStore, backend.pool)


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # a reset while closing is expected: not "never retrieved"


def client_gone(request: web.Request) -> bool:
    """The client's connection is closing: a failed write to it was the client leaving."""
    transport = request.transport
    return transport is None or transport.is_closing()
