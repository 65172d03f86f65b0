"""What a model is, once for every client's models list: its context length, its capabilities,
its state and the backends (or boxes) serving it. Each dialect renders the same `Card` in the
fields its clients read (OpenAI's `/models`, Ollama's `/api/tags` and `/api/show`, Gemini's
models list and get).

Context length
    The context a request may really use, as the gateway's clamp sees it (policy/routing.py:
    the model's `max_model_len`, else the backend's, else what the backend's `/v1/models` said:
    vLLM's `max_model_len`, llama.cpp's `meta.n_ctx`), the smallest over the model's backends;
    else what a backend told of the model (Ollama's `/api/show`, llama.cpp's `/props` n_ctx).
Capabilities
    Ollama's vocabulary (config.MODEL_CAPABILITIES): from the backends that tell
    (upstream/capabilities.py; a peer gateway's own card), only what all of them agree on; else the
    model's `capabilities:` in the config (vLLM says nothing: a reasoning model on vLLM needs
    `thinking` there); else `completion` alone. A FIM template (`fim:`) adds `insert`. Nothing is
    guessed from a model's name.
State
    Per backend: a managed one's lifecycle state (`ready` -> loaded, `starting` -> loading,
    `sleeping`, `stopped`, `failed`, `draining`/`stopping` -> unloading); any other `loaded` while
    its health probe says up, else `down`; a peer's is what the peer reported for the model. The
    model's state is the best of its backends' (loaded > loading > unloading > sleeping >
    stopped > failed > down): a client may send it a request when it is anything but `down`
    (a stopped managed model starts on its first request).
Backends are asked at most once a minute each (`FACTS_TTL_S`), in parallel, a down one never.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..config import MEDIA_CAPABILITIES as MEDIA
from ..policy.routing import BackendState, Route
from ..upstream.capabilities import Facts, can_tell, fetch_facts
from .context import Gateway

__all__ = ["MEDIA", "BackendCard", "Card", "backend_state", "card", "cards", "media_capabilities",
           "merge_capabilities", "model_state"]

FACTS_TTL_S = 60.0
LIST_TIMEOUT_S = 2.0  # a list must answer: a backend slower than this is left out of the facts
STATES = ("loaded", "loading", "unloading", "sleeping", "stopped", "failed", "down")
_MANAGED = {"ready": "loaded", "starting": "loading", "draining": "unloading", "stopping": "unloading",
            "sleeping": "sleeping", "stopped": "stopped", "failed": "failed"}
_KIND_CAPABILITIES = {"whispercpp": ("transcription",)}  # a server that can do nothing else
_facts: dict[tuple[str, str], tuple[float, Facts | None]] = {}  # (backend url, model) -> (until, facts)


@dataclass(frozen=True)
class BackendCard:
    name: str
    kind: str | None
    state: str
    slots: int
    in_use: int
    queued: int
    load_eta_s: float | None = None  # a managed backend: how long a start takes (its last one)


@dataclass(frozen=True)
class Card:
    name: str  # the client name listed
    model: str  # the configured model it resolves to
    context_length: int | None
    capabilities: tuple[str, ...]
    state: str
    backends: tuple[BackendCard, ...]
    facts: Facts  # the backend's account as told (Ollama's model_info, details, template)

    @property
    def loaded(self) -> bool:
        return self.state == "loaded"

    @property
    def slots(self) -> int:
        """What the boxes serving the model can run at once (every backend not down)."""
        return sum(b.slots for b in self.backends if b.state != "down")


def backend_state(managed_state: str | None, up: bool) -> str:
    """A backend's state as a models list shows it (pure). `managed_state`: its lifecycle state
    when the gateway runs it, else None."""
    if managed_state is not None:
        return _MANAGED.get(managed_state, "stopped")
    return "loaded" if up else "down"


def model_state(states: list[str]) -> str:
    """The best of a model's backends' states (pure): what a request for it meets."""
    known = [s for s in states if s in STATES]
    return min(known, key=STATES.index) if known else "down"


def merge_capabilities(told: list[tuple[str, ...]], configured: list[str] | None, fim: bool) -> tuple[str, ...]:
    """What the backends that tell agree on, else the configured list, else `completion` alone;
    plus `insert` for a FIM template (pure)."""
    if told:
        caps = [c for c in told[0] if all(c in t for t in told[1:])]
    else:
        caps = list(configured) if configured else ["completion"]
    if fim and "insert" not in caps:
        caps.append("insert")
    return tuple(caps)


def media_capabilities(configured: list[str] | None, kinds: list[str | None]) -> tuple[str, ...] | None:
    """A media model's capabilities (pure): its configured list when that names a media kind,
    else what its backends' kind can only be; None: not a media model (the usual merge
    applies)."""
    if configured and any(c in MEDIA for c in configured):
        return tuple(dict.fromkeys(configured))
    by_kind = [_KIND_CAPABILITIES.get(k or "") for k in kinds]
    if kinds and all(by_kind):
        return tuple(dict.fromkeys(c for caps in by_kind for c in caps or ()))
    return None


def _backend_card(gw: Gateway, b: BackendState, upstream_model: str) -> BackendCard:
    managed, eta = None, None
    if gw.fleet.managed(b.name):
        unit = gw.fleet.units.get(b.name)
        managed = unit.state.value if unit is not None else None
        eta = round(gw.fleet.load_eta_s(b.name), 3)
    state = backend_state(managed, b.up)
    if b.peer is not None and state == "loaded":  # a peer box tells its model's own state
        pb = b.peer.for_model(upstream_model)
        state, eta = (pb.state, pb.load_eta_s) if pb is not None else ("down", None)
    return BackendCard(b.name, b.cfg.kind, state, b.pool.slots, b.pool.in_use, b.pool.queued, eta)


async def backend_facts(gw: Gateway, route: Route, timeout_s: float = 5.0) -> list[Facts]:
    """What the route's backends (up, and of a kind that tells) say of its model, cached."""
    now = time.monotonic()

    async def one(b: BackendState) -> Facts | None:
        key = (b.cfg.url, route.upstream_model)
        cached = _facts.get(key)
        if cached is None or cached[0] < now:
            got = await fetch_facts(gw.clients[b.name], b.cfg.kind, route.upstream_model, timeout_s)
            if len(_facts) > 1024:
                _facts.clear()
            _facts[key] = cached = (time.monotonic() + FACTS_TTL_S, got)
        return cached[1]

    told = []
    for b in route.backends:  # a peer box's own card, as its last poll read it
        pm = b.peer.models.get(route.upstream_model) if b.peer is not None and b.up else None
        if pm is not None and pm.capabilities:
            told.append(Facts(pm.capabilities, context_length=pm.context_length))
    asking = [b for b in route.backends if b.up and can_tell(b.cfg.kind) and b.name in gw.clients]
    got = await asyncio.gather(*(one(b) for b in asking))
    return told + [f for f in got if f is not None]


async def card(gw: Gateway, name: str, route: Route, timeout_s: float = 5.0) -> Card:
    told = await backend_facts(gw, route, timeout_s)
    m = gw.cfg.models.get(route.model)
    configured = m.capabilities if m is not None else None
    media = media_capabilities(configured, [b.cfg.kind for b in route.backends])
    caps = media if media is not None else merge_capabilities(
        [f.capabilities for f in told], configured, route.fim is not None)
    first = told[0] if told else Facts(caps)
    lens = [f.context_length for f in told if f.context_length]
    context = route.smallest_context() or (min(lens) if lens else None)
    backends = tuple(_backend_card(gw, b, route.upstream_model) for b in route.backends)
    return Card(name, route.model, context, caps, model_state([b.state for b in backends]), backends, first)


async def cards(gw: Gateway, listed: list[tuple[str, Route]]) -> list[Card]:
    """The cards of the listed models, their backends asked in parallel (and briefly)."""
    return list(await asyncio.gather(*(card(gw, n, r, LIST_TIMEOUT_S) for n, r in listed)))
