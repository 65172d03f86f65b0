"""The gateway's live state: config applied and reloaded, backends and their clients, probes.

One `Gateway` per process. It is what survives a config reload (pools keep their accounting,
replaced upstream clients are retired once their streams end) and what every surface handler is
given: surfaces see it through `surfaces.context.Gateway`, ops through `ops.context.OpsGateway`,
Protocols declared in those layers so neither imports this one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, TypeVar

from aiohttp import web

from .. import config as cfgmod
from ..admission.slots import SlotPool
from ..admission.supersede import LatestWins, Supersede
from ..errors import GatewayError
from ..lifecycle.fleet import Fleet
from ..ops import health
from ..ops.accesslog import AccessLog
from ..ops.metrics import Metrics
from ..policy import limits
from ..policy.auth import Auth, Principal
from ..policy.forwarded import HEADERS, Forwarding
from ..policy.routing import BackendState, PeerLink, Router
from ..request.tracker import Tracked, Tracker
from ..surfaces.responses.state import ResponsesState
from ..surfaces.signature import ThinkingSigner
from ..tracing import otel
from ..upstream import backend_kind
from ..upstream.client import UpstreamClient
from ..usage import Ledger
from . import peers
from .connguard import ConnectionGuard
from .timing import server_timing

if TYPE_CHECKING:  # imported at run time only with a `cluster:` section (they import redis's users)
    from ..admission.redis_leases import Registry, RedisSlotPool
    from ..admission.redis_supersede import SharedSupersede

log = logging.getLogger("homelab_frontend")
T = TypeVar("T")
TRACKED = web.RequestKey("hlf_tracked", Tracked)  # the record, for what reads the body (capture_content)
BODY_BYTES = web.RequestKey("hlf_body_bytes", int)  # the body's size (the ledger's estimate of an unreported prompt)
OFF_LOOP_BYTES = 1 << 20  # bodies from this size on are parsed off the event loop


def _pool(name: str, b: cfgmod.Backend, cluster: Registry | None = None) -> SlotPool | RedisSlotPool:
    if cluster is not None:  # replicas share the slots through Redis (slots_redis)
        return cluster.pool(name, b.slots, b.queue.depth, b.queue.timeout_s)
    return SlotPool(name, b.slots, b.queue.depth, b.queue.timeout_s)


class Gateway:
    """Everything a request handler needs, and what survives a config reload."""

    cfg: cfgmod.Config  # set by apply(), which __init__ calls

    def __init__(self, cfg: cfgmod.Config, config_path: str | None = None) -> None:
        self.config_path = config_path
        self.tracker = Tracker()
        self.supersede: LatestWins = Supersede()  # latest-wins completions (admission/supersede.py)
        self.backends: dict[str, BackendState] = {}
        # the configured backends' slot stores as made, for the fleet (lifecycle takes admission's
        # SlotStore; a BackendState holds routing's view of the same object, policy.routing's)
        self.pools: dict[str, SlotPool | RedisSlotPool] = {}
        self.clients: dict[str, UpstreamClient] = {}
        self.access_log = AccessLog(cfg.access_log)
        secret = os.environ.get(cfg.anthropic.signing_key_env or "") if cfg.anthropic.signing_key_env else None
        self.signer = ThinkingSigner(secret.encode() if secret else None)
        self.metrics = Metrics(self)
        self.connguard: ConnectionGuard | None = None  # set by build_app
        self.shared_supersede: SharedSupersede | None = None  # latest wins across replicas, with a cluster
        self.cluster: Registry | None = None  # when a `cluster:` section shares slots via Redis
        if cfg.cluster is not None:
            from ..ops.cluster import attach  # imports redis: only when a cluster is configured

            self.cluster = attach(self, cfg.cluster)
            from ..admission.redis_supersede import SharedSupersede

            self.shared_supersede = SharedSupersede(self.cluster)  # latest wins across the replicas
            self.supersede = self.shared_supersede
        # who used what (usage/): fed by observe(), budgets checked by hold()
        self.usage = Ledger(cfg, self.cluster.client if self.cluster is not None else None) if cfg.usage.enabled else None
        self.tracing = otel.start(cfg.tracing)  # None unless tracing.otlp_endpoint is configured
        self.draining = False  # SIGTERM received: new requests are refused, running ones finish
        self._probes: dict[str, asyncio.Task] = {}
        self._kicked: dict[str, asyncio.Task] = {}
        self._reading: dict[str, asyncio.Task] = {}  # a read of a backend's running count in flight
        self._wake: dict[str, asyncio.Event] = {}  # set when its requests mark a backend down
        self._retiring: set[asyncio.Task] = set()
        # managed backends (`run:`): their processes, and the gate on each one's slot queue
        self.fleet = Fleet()
        self.fleet.on_change = self._managed_changed
        if self.cluster is not None:  # only the replica holding the lifecycle lease runs servers
            from ..lifecycle.cluster import Coordinator

            self.fleet.coord = Coordinator(self.cluster.client, self.cluster.replica, self.cluster.lease_s)
        self.apply(cfg)
        self.responses = ResponsesState(self)  # reasoning sealer and the response store

    # -- configuration ------------------------------------------------------------------------

    def apply(self, cfg: cfgmod.Config) -> None:
        """Swap in a validated config. Pools live on (held slots stay accounted); requests in
        flight keep the route they resolved; new requests see the new table."""
        problems = cfgmod.environment_problems(cfg)  # what `check` asks too
        if problems:
            raise cfgmod.ConfigError(problems)  # before anything changes
        for warning in cfgmod.warnings(cfg):
            log.warning("config: %s", warning)
        auth = Auth(cfg.auth)
        forwarding = Forwarding(cfg.connections.trusted_proxies, cfg.connections.forwarded_header)
        auth.inherit(getattr(self, "auth", None))
        self.fleet.configure(cfg)
        for name, b in cfg.backends.items():
            state = self.backends.get(name)
            if state is None:
                self.pools[name] = _pool(name, b, self.cluster)
                state = self.backends[name] = BackendState(name, backend_kind.effective(b, None),
                                                           self.pools[name])
                state.on_down = self._marked_down
            else:
                state.cfg = backend_kind.effective(b, state.detected_kind)
                state.pool.resize(b.slots, b.queue.depth, b.queue.timeout_s)
            self.fleet.attach(name, self.pools[name])
            state.auto_kind = b.kind is None
            if state.cfg.kind == "peer" and state.peer is None:
                state.peer = PeerLink(name)
            old = self.clients.get(name)
            if old is None or old.cfg.url != b.url or old.cfg.api_key_env != b.api_key_env or old.cfg.timeouts != b.timeouts:
                if old is not None:
                    self._retire(name, old)
                self.clients[name] = UpstreamClient(name, b)
            else:
                old.cfg = b
        for name in list(self.backends):
            if name not in cfg.backends and not self._peer_child(name, cfg):
                self._drop_if_idle(name)  # still-busy removed backends linger until idle
        if hasattr(self, "cfg"):
            for section in ("cluster", "usage", "tracing"):  # budgets (auth.keys) do apply now
                if getattr(cfg, section) != getattr(self.cfg, section):
                    log.warning("%s: changes to the %s section take effect at the next restart", section, section)
        self.cfg = cfg
        self.auth = auth
        self.forwarding = forwarding
        if self.usage is not None:
            self.usage.configure(cfg)
        self.router = Router(cfg, self.backends)
        if _loop_running():
            self.start_probes()
            self.fleet.start()

    def _peer_child(self, name: str, cfg: cfgmod.Config | None = None) -> bool:
        """One of a peer's backends (app/peers.py), its peer still configured: its life is the
        peer's report's, not the config's."""
        state = self.backends.get(name)
        link = state.peer if state is not None else None
        return link is not None and bool(link.backend) and link.parent in (cfg or self.cfg).backends

    async def start(self) -> None:
        """Before the port opens. The ledger first: a file it cannot write stops the start
        (ConfigError) before anything else is opened."""
        if self.usage is not None:
            await self.usage.start()
        self.start_probes()
        self.fleet.start()  # managed backends: preloads start now, the rest on their first request
        if self.cluster is not None:
            await self.cluster.start()  # first contact with Redis before the port opens
            assert self.shared_supersede is not None  # made with the cluster
            await self.shared_supersede.start()  # subscribed to the others' completions

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

    def _drop_if_idle(self, name: str) -> bool:
        """Forget a backend the config no longer names, once nothing holds or waits for its
        slots (its client closes when the requests still streaming through it are done)."""
        pool = self.backends[name].pool
        if pool.in_use or pool.queued:
            return False
        del self.backends[name]
        self.pools.pop(name, None)  # a peer's backend has none here (app/peers.py)
        old = self.clients.pop(name, None)
        if old is not None:
            self._retire(name, old)
        return True

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
        body = b"".join(chunks)
        request[BODY_BYTES] = size
        if self.tracing is not None and self.tracing.capture:
            t = request.get(TRACKED)
            if t is not None:
                self.tracing.remember_prompt(t, body)
        return body

    def note_body(self, request: web.Request, size: int) -> None:
        request[BODY_BYTES] = size

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

    def client_address(self, request: web.Request) -> str:
        """The client's address as believed (policy/forwarded.py): the header is read only when
        the peer is a trusted proxy."""
        fwd = self.forwarding
        return fwd.client(request.remote, request.headers.getall(HEADERS[fwd.header], ()))

    def headers(self, t: Tracked) -> dict[str, str]:
        h = {"request-id": t.id, "server-timing": server_timing(t)}
        if t.served_model is not None:  # the configured model that answered (a fallback's, if one)
            h["x-hlf-served-model"] = t.served_model
        return h

    def hold(self, principal: Principal):
        """Admission for a key: its token budget (429 past it), then its max_concurrent."""
        if self.usage is not None and principal.name and self.usage.budgeted(principal.name):
            return self._hold_budgeted(principal)
        return self.auth.hold(principal)

    @asynccontextmanager
    async def _hold_budgeted(self, principal: Principal) -> AsyncIterator[None]:
        await self.usage.check(principal.name)  # type: ignore[union-attr]
        async with self.auth.hold(principal):
            yield

    def observe(self, t: Tracked, path: str) -> None:
        self.access_log.write(t, path)
        if self.metrics is not None:
            self.metrics.observe(t)
        if self.usage is not None:
            self.usage.record(t)
        if t.trace is not None and self.tracing is not None:
            self.tracing.export(t, path)
        if t.backend is not None and (t.outcome == "error_upstream_unreachable" or (
                (t.outcome or "").startswith("error_upstream") and self._peer_child(t.backend))):
            self._kick_probe(t.backend)  # a peer box that failed one: its report read again at once

    def _kick_probe(self, name: str) -> None:
        """Probe now (once at a time): a failed connect marks the backend down only when the
        probe agrees, so one dropped keep-alive connection cannot take a backend out. Not for a
        backend its requests marked down: its re-probes back off (policy/passive_health.py)."""
        if self._peer_child(name):
            name = self.backends[name].peer.parent  # type: ignore[union-attr]  # its peer reads it
        task = self._kicked.get(name)
        state = self.backends.get(name)
        if state is None or (not state.up and state.passive.suspect):
            return
        if (task is None or task.done()) and _loop_running():
            self._kicked[name] = asyncio.get_running_loop().create_task(self.probe(name))

    # -- backend health -----------------------------------------------------------------------

    def start_probes(self) -> None:
        for name in list(self._probes):
            if name not in self.backends:
                self._probes.pop(name).cancel()
        for name in self.backends:
            if self._peer_child(name):
                continue  # its peer's probe reads it
            if name not in self._probes or self._probes[name].done():
                self._probes[name] = asyncio.get_running_loop().create_task(self._probe_loop(name))

    async def probe(self, name: str) -> None:
        state = self.backends.get(name)
        client = self.clients.get(name)
        if state is not None and client is not None:
            doc = await health.probe(state, client)
            if self._down_by_design(name):  # stopped (or stopping) while the probe ran
                return
            state.passive.probed(state.up)
            if state.cfg.kind == "peer" and name in self.cfg.backends:
                self._peer_report(state, doc)

    def _peer_report(self, state: BackendState, doc: object) -> None:
        """A peer's models list (or its silence): its backends here follow it (app/peers.py)."""
        peers.note_poll(state)
        if not state.up:
            peers.mark_down(state, self.backends)
            return
        if peers.reconcile(state, doc, self.backends, self.clients, self._drop_if_idle):
            self.router = Router(self.cfg, self.backends)

    def _marked_down(self, state: BackendState) -> None:
        """Its requests marked a backend down (policy/passive_health.py): the probe loop re-plans
        its next probe, soon, instead of a whole health interval on."""
        log.warning("marked down: %s", state.last_error)  # last_error names the backend
        wake = self._wake.get(state.name)
        if wake is not None:
            wake.set()

    def _probe_interval(self, state: BackendState) -> float:
        if not state.up and state.passive.suspect:
            return state.passive.next_probe_s(state.cfg.health_interval_s)
        return state.cfg.health_interval_s

    async def _probe_loop(self, name: str) -> None:
        while name in self.backends:
            if name not in self.cfg.backends:  # removed by a reload while still busy
                if self._drop_if_idle(name):
                    return
                await asyncio.sleep(0.5)
                continue
            if self._down_by_design(name):
                await asyncio.sleep(0.5)
                continue
            wake = self._wake.setdefault(name, asyncio.Event())
            wake.clear()  # a mark-down from here on re-plans the wait after this probe
            await self.probe(name)
            await self._until_next_probe(name, wake)

    async def _until_next_probe(self, name: str, wake: asyncio.Event) -> None:
        """One health interval (or, for a backend its requests marked down, the passive-health
        backoff: re-planned when `wake` says they just did); meanwhile, while a slot there is
        held, the backend's own running count is re-read every `health.HELD_REFRESH_S`."""
        state = self.backends.get(name)
        if state is None:
            await asyncio.sleep(1)
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + self._probe_interval(state)
        while (left := end - loop.time()) > 0:
            step = min(left, health.HELD_REFRESH_S) if state.up and health.reads_running(state) else left
            try:
                await asyncio.wait_for(wake.wait(), step)
            except TimeoutError:
                pass
            else:
                wake.clear()
                end = loop.time() + self._probe_interval(state)
                continue
            if state.up and state.pool.in_use and health.reads_running(state) and end - loop.time() > step / 4:
                await self._read_running(name)

    async def refresh_running(self) -> None:
        """Re-read the running count of every backend (up) that tells it, for `/admin/requests`."""
        names = [n for n, b in self.backends.items() if b.up and health.reads_running(b) and n in self.clients]
        if names:
            await asyncio.gather(*(self._read_running(n) for n in names))

    def _read_running(self, name: str) -> Awaitable[None]:
        """At most one read per backend in flight, whoever asks (dashboards poll every second)."""
        task = self._reading.get(name)
        if task is None or task.done():
            state, client = self.backends[name], self.clients[name]
            task = self._reading[name] = asyncio.get_running_loop().create_task(
                health.leak_check(state, client, timeout_s=1.0))
        return asyncio.shield(task)  # an admin request that goes away does not cancel the read

    def _managed_changed(self, name: str, state) -> None:
        """A managed backend changed state: one that became ready is probed at once (its kind,
        its context lengths); one that is not running by design is not down (a request starts it)."""
        b = self.backends.get(name)
        if b is None:
            return
        if state == "ready":
            self._kick_probe(name)
        else:
            self._down_by_design(name)

    def _down_by_design(self, name: str) -> bool:
        """A managed backend that is not ready is not running by design (a request starts it; the
        fleet answers its failures): never counted down. -> whether that is the case."""
        if not (self.fleet.managed(name) and not self.fleet.ready(name)):
            return False
        b = self.backends.get(name)
        if b is not None:
            b.up, b.last_error = True, None
        return True

    async def close(self) -> None:
        for task in [*self._probes.values(), *self._kicked.values(), *self._reading.values()]:
            task.cancel()
        await self.fleet.close()  # every managed server stopped (SIGTERM, then SIGKILL)
        retiring = list(self._retiring)
        for task in retiring:
            task.cancel()  # its `finally` closes the old client
        await asyncio.gather(*retiring, return_exceptions=True)
        for client in self.clients.values():
            await client.close()
        await self.responses.close()
        if self.usage is not None:
            await self.usage.close()  # the last entries, written (before Redis is let go)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)
        if self.cluster is not None:
            assert self.shared_supersede is not None  # made with the cluster
            await self.shared_supersede.close()
            await self.cluster.close()  # gives back any slot still held, then disconnects


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


GATEWAY = web.AppKey("gateway", Gateway)
