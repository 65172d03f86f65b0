"""Client model names (and aliases / globs) -> a configured model -> the backend to use now."""

from __future__ import annotations

import asyncio
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Literal, Protocol, TypeVar

from . import affinity
from .passive_health import PassiveHealth
from .. import config as cfgmod
from ..errors import GatewayError


LeaseT = TypeVar("LeaseT")


class SlotHolder(Protocol):
    """The request a slot is taken for, as a store sees it: admission.lease.Holder, repeated here
    (routing sits below admission in the import layers); mypy holds each store's `acquire`
    against this one, so the two cannot drift apart unnoticed."""

    id: str
    load_wait: float

    def queued(self) -> None: ...
    def loading(self) -> None: ...
    def cancel(self, reason: str, message: str = "") -> bool: ...


class SlotStore(Protocol[LeaseT]):
    """A backend's slots as the layers above use them: admission.slots.SlotPool (in process) and
    admission.redis_slot_pool.RedisSlotPool (Redis leases) implement it. `acquire` waits in the
    store's queue and returns the lease of the slot taken (admission/lease.py); `release` takes
    that lease back (a second release is a no-op). Generic in the lease: its class is admission's,
    which this layer cannot name, so a `BackendState` holds a `SlotStore[Any]` and the gateway,
    which makes the stores, declares them as admission.slots.SlotStore (whose lease is `Lease`).
    Declared here, not imported: routing sits below admission in the import layers."""

    name: str
    slots: int

    @property
    def in_use(self) -> int: ...

    @property
    def depth(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def expected_wait_s(self) -> float: ...

    async def acquire(self, key: str = "", priority: int = 0, holder: SlotHolder | None = None) -> LeaseT: ...

    def release(self, lease: LeaseT, held_s: float | None = None) -> None: ...

    def resize(self, slots: int, depth: int, timeout_s: float) -> None: ...

    def grant(self) -> None: ...


def resolve_alias(cfg: cfgmod.Config, name: str) -> str | None:
    """The configured model a client name means: itself, an exact alias, or the first glob. A
    name none of these know is tried with Ollama's default tag `:latest` taken off or put on:
    Ollama's clients list `reasoning` as `reasoning:latest` (and VS Code Copilot then sends that
    to the OpenAI routes), and to them an untagged name means `:latest`."""
    known = _known(cfg, name)
    if known is not None:
        return known
    if name.endswith(":latest") and len(name) > len(":latest"):
        return _known(cfg, name[: -len(":latest")])
    if name and ":" not in name.rsplit("/", 1)[-1]:
        return _known(cfg, name + ":latest")
    return None


def _known(cfg: cfgmod.Config, name: str) -> str | None:
    """resolve_alias without the `:latest` step (so the two directions never loop)."""
    if name in cfg.models:
        return name
    target = cfg.aliases.get(name)
    if target is not None:
        return target
    for pattern, target in cfg.aliases.items():
        if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
            return target
    return None


@dataclass
class PeerLink:
    """A backend that is a peer box's (docs/several-boxes.md): the peer itself (`backend` empty:
    the `kind: peer` entry of the config, whose `models` are everything the peer lists), or one of
    the peer's own backends, made here from the peer's report (`parent`/`backend`, its slots the
    peer's), whose `models` are the peer's models it serves. `models` maps a model's name to the
    peer's `upstream.peer.PeerModel`, as the last poll read it. The peer's own link also keeps
    when it was last polled and last answered (time.monotonic(); None: not yet), for the
    dashboard's boxes."""

    parent: str
    backend: str = ""
    models: dict[str, Any] = field(default_factory=dict)
    polled_at: float | None = None
    answered_at: float | None = None
    # one of the peer's backends: set when its box stops answering its polls (app/peers.mark_down),
    # so a request still waiting there for its answer's headers fails over (request/exchange.py)
    _went_down: asyncio.Event | None = None

    def went_down(self) -> asyncio.Event:
        """The event the next mark-down of this box's backend sets (made on first ask)."""
        if self._went_down is None:
            self._went_down = asyncio.Event()
        return self._went_down

    def mark_down(self) -> None:
        """Wake whoever waits on this backend's box, and start a fresh event for the next time."""
        if self._went_down is not None:
            self._went_down.set()
            self._went_down = None

    def for_model(self, model: str) -> Any:
        """The peer's account of this backend for `model` (`upstream.peer.PeerBackend`), or None."""
        pm = self.models.get(model)
        if pm is None:
            return None
        return next((b for b in pm.backends if b.name == self.backend), None)


@dataclass
class BackendState:
    """A backend's live state; survives config reloads (its pool keeps its accounting)."""

    name: str
    cfg: cfgmod.Backend
    pool: SlotStore[Any]  # its lease is admission's Lease (SlotStore's docstring)
    up: bool = True  # last health probe; unknown counts as up
    # why it is down, as one sentence that names it ("backend 'gpu0' is unreachable (connection
    # refused)": the upstream client's and the lifecycle's errors all do): said as it is, never
    # prefixed with the name again
    last_error: str | None = None
    model_lens: dict[str, int] = field(default_factory=dict)  # from /v1/models max_model_len
    upstream_running: int | None = None  # the backend's own running count, where it tells
    upstream_running_at: float | None = None  # time.monotonic() of that reading
    # `kind` left out of the config: cfg.kind is the detected one (upstream/backend_kind.py)
    auto_kind: bool = False
    detected_kind: str | None = None
    passive: PassiveHealth = field(default_factory=PassiveHealth)  # what its real requests say
    on_down: Callable[["BackendState"], None] | None = None  # told when its requests mark it down
    peer: PeerLink | None = None  # a peer box, or one of its backends (docs/several-boxes.md)

    @property
    def free(self) -> int:
        return self.pool.slots - self.pool.in_use

    def connection_failed(self, message: str) -> bool:
        """A request could not connect to it (policy/passive_health.py). -> True when that marked
        it down."""
        if not self.up or not self.passive.connection_failed():
            return False
        self.up = False
        self.last_error = f"{message}, seen on its requests (probed again soon)"
        if self.on_down is not None:
            self.on_down(self)
        return True

    def readiness(self, model: str) -> tuple[str, float]:
        """(state, seconds until it could start answering) of `model` here, as far as it is told:
        a peer's backend reports both; any other backend counts as loaded (a local managed one
        waits in its own queue, whose gate knows better: lifecycle/)."""
        if self.peer is None or not self.peer.backend:
            return "loaded", 0.0
        pb = self.peer.for_model(model)
        if pb is None:
            return "down", float("inf")
        if pb.state == "loaded":
            return "loaded", 0.0
        return pb.state, pb.load_eta_s if pb.load_eta_s is not None else 60.0

    @property
    def loading(self) -> bool:
        """A peer's backend that reports a model loading: the first-token clock stands still
        (request/exchange.py), as it does for a local managed backend's queue."""
        if self.peer is None or not self.peer.backend:
            return False
        return any(b.name == self.peer.backend and b.state == "loading"
                   for pm in self.peer.models.values() for b in pm.backends)

    def interchangeable(self, other: "BackendState") -> bool:
        """Whether a request planned for this backend may go to `other` as it is: the surfaces
        decide from the backend, before opening, whether to stream a plain answer upstream and
        whether to match stop strings themselves (config.Backend)."""
        a, b = self.cfg, other.cfg
        return a.streams_upstream == b.streams_upstream and a.reports_stop_reason == b.reports_stop_reason


@dataclass(frozen=True)
class Route:
    client_model: str  # what the client sent; answers echo it
    model: str  # the configured model it resolved to
    upstream_model: str
    backends: tuple[BackendState, ...]
    max_model_len: int | None
    system_turns: Literal["merge", "native"] = "merge"  # config.Model.system_turns
    affinity: bool = True
    affinity_max_wait_s: float = 2.0
    # the model to serve instead when every backend of this one is down (config.Model.fallback),
    # resolved for the same client name
    fallback: "Route | None" = None
    requested: str = ""  # the configured model the client's name resolved to (before any fallback)
    # code completion (config.Model): queue priority, latest-wins, the FIM template
    priority: int = 0
    supersede: bool = False
    fim: cfgmod.Fim | None = None

    @property
    def all_down(self) -> bool:
        return not any(b.up for b in self.backends)

    def serving(self) -> "Route":
        """This route, or when every backend of its model is down (not merely busy: busy waits
        in the queue) the first fallback in its chain with a backend up. When the whole chain is
        down, this route: its refusal names this model's backends."""
        route: Route | None = self
        while route is not None and route.all_down:
            route = route.fallback
        return route or self

    @property
    def wants_session(self) -> bool:
        """Whether a session key could change the choice (so is worth computing at all)."""
        return self.affinity and len(self.backends) > 1

    def choose(self, session: str | None = None) -> BackendState:
        return self.place(session)[0]

    def place(self, session: str | None = None) -> tuple[BackendState, str | None]:
        """The backend for a request, and how affinity went: "hit" (its session's backend),
        "spill" (that one was too busy: the least loaded instead), or None (no session key, one
        backend up, or affinity off). Without affinity: the backend with the most free slots
        (then the shortest queue) among those up. When all are down, fail fast instead of
        queueing for a backend that cannot answer."""
        best: BackendState | None = None
        up = self._warm([b for b in self.backends if b.up])
        for b in up:
            if best is None or (b.free, -b.pool.queued) > (best.free, -best.pool.queued):
                best = b
        if best is None:
            # Down, not busy: its own kind, and Retry-After is when the next probe may bring it
            # back (sooner for one its requests marked down: policy/passive_health.py). Each
            # backend named once, with its error: `last_error` is a sentence naming it already.
            reasons = "; ".join(b.last_error or f"backend {b.name!r} is down" for b in self.backends)
            raise GatewayError(
                "backend_down", f"model {self.client_model!r} is down: {reasons}",
                retry_after=min(b.passive.next_probe_s(b.cfg.health_interval_s) for b in self.backends),
            )
        if session is None or not self.affinity or len(up) < 2:
            return best, None
        preferred = max(up, key=lambda b: affinity.score(session, b.name))
        if preferred is best or preferred.free > 0:
            return preferred, "hit"
        pool = preferred.pool
        if pool.queued < pool.depth and (
            pool.expected_wait_s() <= best.pool.expected_wait_s() + self.affinity_max_wait_s
        ):
            return preferred, "hit"
        return best, "spill"

    def _warm(self, up: list[BackendState]) -> list[BackendState]:
        """Loaded first, for a model several boxes serve (docs/several-boxes.md): the backends
        where it is loaded while one of them has a free slot; when none has, those where it must
        start only if the shortest expected wait where it is loaded (admission's own estimate)
        is longer than the quickest start elsewhere (the peer's figure) plus that peer's
        `peer.start_penalty_s`. Where it is loaded nowhere: every backend up, as before."""
        if len(up) < 2:
            return up
        ready = {b.name: b.readiness(self.upstream_model) for b in up}
        loaded = [b for b in up if ready[b.name][0] == "loaded"]
        if len(loaded) == len(up) or not loaded:
            return up
        if any(b.free > 0 for b in loaded):
            return loaded
        cold = [b for b in up if ready[b.name][0] != "loaded"]
        wait = min(b.pool.expected_wait_s() for b in loaded)
        start = min(ready[b.name][1] + b.cfg.peer.start_penalty_s for b in cold)
        return cold if wait > start else loaded

    def alternative(self, tried: Collection[str], failed: BackendState) -> BackendState | None:
        """Another backend to send a request to after `failed` failed it before answering
        (request/failover.py): one up, not tried yet, interchangeable with `failed`, with the
        most free slots (then the shortest queue). None when there is none."""
        best: BackendState | None = None
        for b in self.backends:
            if not b.up or b.name in tried or not failed.interchangeable(b):
                continue
            if best is None or (b.free, -b.pool.queued) > (best.free, -best.pool.queued):
                best = b
        return best

    def context_length(self, backend: BackendState) -> int | None:
        return self.max_model_len or backend.cfg.max_model_len or backend.model_lens.get(
            self.upstream_model
        )

    def smallest_context(self) -> int | None:
        """The context every backend of the route can hold: the smallest one known (what a model
        listing tells a client it may use), None when no backend says."""
        known = [n for n in (self.context_length(b) for b in self.backends) if n]
        return min(known) if known else None


class Router:
    """Client names -> routes. A peer box's models (docs/several-boxes.md) are served under their
    own names beside the configured ones (a configured name wins), each on the peer's backends
    that serve it; the gateway makes a new Router whenever a peer's list changes."""

    def __init__(self, cfg: cfgmod.Config, backends: dict[str, BackendState]) -> None:
        self.cfg = cfg
        self.backends = backends
        self._cache: dict[str, Route] = {}
        self.peer_models = self._peer_models()

    def _peer_models(self) -> dict[str, list[BackendState]]:
        """Each peer model served under its own name -> the peers (their config entries) listing it."""
        out: dict[str, list[BackendState]] = {}
        for name, b in self.backends.items():
            if b.peer is None or b.peer.backend or name not in self.cfg.backends:
                continue
            allowed = self.cfg.backends[name].peer.models
            for model in b.peer.models:
                if model in self.cfg.models:
                    continue  # a configured name wins
                if allowed is not None and not any(fnmatch.fnmatchcase(model, p) for p in allowed):
                    continue
                out.setdefault(model, []).append(b)
        return out

    def model_names(self) -> list[str]:
        return [*self.cfg.models, *sorted(self.peer_models)]

    def resolve(self, client_model: str) -> Route:
        route = self._cache.get(client_model)
        if route is None:
            route = self._route(client_model)
            if len(self._cache) < 4096:  # client names are unbounded input: cap the memo
                self._cache[client_model] = route
        return route.serving() if route.fallback is not None else route

    def _route(self, client_model: str) -> Route:
        name = resolve_alias(self.cfg, client_model)
        if name is not None and name in self.cfg.models:
            return self._model_route(client_model, name, name)
        target = name if name is not None else client_model
        peers = self.peer_models.get(target)
        if peers is None and name is None and target.endswith(":latest"):
            target = target[: -len(":latest")]  # Ollama's clients' tag (resolve_alias's rule)
            peers = self.peer_models.get(target)
        if peers is None:
            available = ", ".join(self.model_names()) or "(none configured)"
            raise GatewayError(
                "not_found",
                f"model {client_model!r} not found; available models: {available}",
                param="model",
            )
        return Route(client_model=client_model, model=target, upstream_model=target,
                     backends=tuple(self._expand(peers, target)), max_model_len=None, requested=target)

    def _expand(self, named: list[BackendState], upstream_model: str) -> list[BackendState]:
        """Backends as routes use them: a peer (its config entry) is the peer's own backends that
        serve the model, as its last report said; the peer itself while it has said nothing of
        it (its refusals then name it)."""
        out: list[BackendState] = []
        for b in named:
            if b.peer is None or b.peer.backend:
                out.append(b)
                continue
            subs = [s for s in self.backends.values()
                    if s.peer is not None and s.peer.parent == b.name and s.peer.backend
                    and s.peer.for_model(upstream_model) is not None]
            out.extend(subs or [b])
        return out

    def _model_route(self, client_model: str, name: str, requested: str, seen: tuple[str, ...] = ()) -> Route:
        m = self.cfg.models[name]
        fallback = None
        if m.fallback is not None and m.fallback not in seen and m.fallback != name:  # config rejects loops
            fallback = self._model_route(client_model, m.fallback, requested, (*seen, name))
        upstream_model = m.upstream_model or name
        return Route(
            client_model=client_model,
            model=name,
            upstream_model=upstream_model,
            backends=tuple(self._expand([self.backends[b] for b in m.backend_names()], upstream_model)),
            max_model_len=m.max_model_len,
            system_turns=m.system_turns,
            affinity=m.affinity,
            affinity_max_wait_s=m.affinity_max_wait_s,
            fallback=fallback,
            requested=requested,
            priority=m.priority,
            supersede=m.supersede,
            fim=m.fim_template(),
        )
