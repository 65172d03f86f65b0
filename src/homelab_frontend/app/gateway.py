"""The gateway's live state: config applied and reloaded, backends and their clients (their
probes are app/probes.py's).

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
from typing import TYPE_CHECKING, AsyncIterator, Callable, TypeVar

from aiohttp import web

from .. import config as cfgmod
from ..admission.slots import SlotPool
from ..admission.supersede import LatestWins, Supersede
from ..errors import GatewayError
from ..lifecycle.fleet import Fleet
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
from .connguard import ConnectionGuard
from .probes import Probes
from .timing import server_timing

if TYPE_CHECKING:  # imported at run time only with a `cluster:` section (they import redis's users)
    from ..admission.redis_registry import Registry
    from ..admission.redis_slot_pool import RedisSlotPool
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

    cfg: cfgmod.Config  # set by _apply(), which __init__ calls
    auth: Auth

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
        self.probes = Probes(self)  # when each backend is asked how it is (app/probes.py)
        self._retiring: set[asyncio.Task] = set()
        # managed backends (`run:`): their processes, and the gate on each one's slot queue
        self.fleet = Fleet()
        self.fleet.on_change = self._managed_changed
        if self.cluster is not None:  # only the replica holding the lifecycle lease runs servers
            from ..lifecycle.cluster import Coordinator

            self.fleet.coord = Coordinator(self.cluster.client, self.cluster.replica, self.cluster.lease_s)
        self._apply(cfg, None)
        self.responses = ResponsesState(self)  # reasoning sealer and the response store

    # -- configuration ------------------------------------------------------------------------

    def apply(self, cfg: cfgmod.Config) -> None:
        """Swap in a validated config. Pools live on (held slots stay accounted); requests in
        flight keep the route they resolved; new requests see the new table."""
        self._apply(cfg, self.cfg)

    def _apply(self, cfg: cfgmod.Config, before: cfgmod.Config | None) -> None:
        """`before`: the config applied until now (None at start-up)."""
        problems = cfgmod.environment_problems(cfg)  # what `check` asks too
        if problems:
            raise cfgmod.ConfigError(problems)  # before anything changes
        for warning in cfgmod.warnings(cfg):
            log.warning("config: %s", warning)
        auth = Auth(cfg.auth)
        forwarding = Forwarding(cfg.connections.trusted_proxies, cfg.connections.forwarded_header)
        if before is not None:
            auth.inherit(self.auth)
        self.fleet.configure(cfg)
        for name, b in cfg.backends.items():
            state = self.backends.get(name)
            if state is None:
                self.pools[name] = _pool(name, b, self.cluster)
                state = self.backends[name] = BackendState(name, backend_kind.effective(b, None),
                                                           self.pools[name])
                state.on_down = self.probes.marked_down
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
            if name not in cfg.backends and not self.peer_child(name, cfg):
                self.drop_if_idle(name)  # still-busy removed backends linger until idle
        if before is not None:
            for section in ("cluster", "usage", "tracing"):  # budgets (auth.keys) do apply now
                if getattr(cfg, section) != getattr(before, section):
                    log.warning("%s: changes to the %s section take effect at the next restart", section, section)
        self.cfg = cfg
        self.auth = auth
        self.forwarding = forwarding
        if self.usage is not None:
            self.usage.configure(cfg)
        self.router = Router(cfg, self.backends)
        if _loop_running():
            self.probes.start()
            self.fleet.start()

    def peer_child(self, name: str, cfg: cfgmod.Config | None = None) -> bool:
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
        self.probes.start()
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

    def drop_if_idle(self, name: str) -> bool:
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
                (t.outcome or "").startswith("error_upstream") and self.peer_child(t.backend))):
            self.probes.kick(t.backend)  # a peer box that failed one: its report read again at once

    async def refresh_running(self) -> None:
        """Re-read the running count of every backend that tells it, for `/admin/requests`."""
        await self.probes.refresh_running()

    def _managed_changed(self, name: str, state) -> None:
        """A managed backend changed state: one that became ready is probed at once (its kind,
        its context lengths); one that is not running by design is not down (a request starts it)."""
        b = self.backends.get(name)
        if b is None:
            return
        if state == "ready":
            self.probes.kick(name)
        else:
            self.down_by_design(name)

    def down_by_design(self, name: str) -> bool:
        """A managed backend that is not ready is not running by design (a request starts it; the
        fleet answers its failures): never counted down. -> whether that is the case."""
        if not (self.fleet.managed(name) and not self.fleet.ready(name)):
            return False
        b = self.backends.get(name)
        if b is not None:
            b.up, b.last_error = True, None
        return True

    async def close(self) -> None:
        self.probes.close()
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
