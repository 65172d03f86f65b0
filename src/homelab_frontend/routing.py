"""Client model names (and aliases / globs) -> a configured model -> the backend to use now."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import config as cfgmod
from .errors import GatewayError
from .slots import SlotPool


@dataclass
class BackendState:
    """A backend's live state; survives config reloads (its pool keeps its accounting)."""

    name: str
    cfg: cfgmod.Backend
    pool: SlotPool
    up: bool = True  # last health probe; unknown counts as up
    last_error: str | None = None
    model_lens: dict[str, int] = field(default_factory=dict)  # from /v1/models max_model_len
    upstream_running: int | None = None  # the backend's own running count, where it tells
    # `kind` left out of the config: cfg.kind is the detected one (backend_kind.py)
    auto_kind: bool = False
    detected_kind: str | None = None

    @property
    def free(self) -> int:
        return self.pool.slots - self.pool.in_use


@dataclass(frozen=True)
class Route:
    client_model: str  # what the client sent; answers echo it
    model: str  # the configured model it resolved to
    upstream_model: str
    backends: tuple[BackendState, ...]
    max_model_len: int | None

    def choose(self) -> BackendState:
        """The backend with the most free slots (then the shortest queue) among those up.
        When all are down, fail fast instead of queueing for a backend that cannot answer."""
        best: BackendState | None = None
        for b in self.backends:
            if not b.up:
                continue
            if best is None or (b.free, -b.pool.queued) > (best.free, -best.pool.queued):
                best = b
        if best is None:
            names = ", ".join(repr(b.name) for b in self.backends)
            detail = "; ".join(f"{b.name}: {b.last_error}" for b in self.backends if b.last_error)
            raise GatewayError(
                "upstream_unreachable",
                f"model {self.client_model!r}: backend {names} is down"
                + (f" ({detail})" if detail else ""),
                status=503,
                retry_after=5,
            )
        return best

    def context_length(self, backend: BackendState) -> int | None:
        return self.max_model_len or backend.cfg.max_model_len or backend.model_lens.get(
            self.upstream_model
        )


class Router:
    def __init__(self, cfg: cfgmod.Config, backends: dict[str, BackendState]) -> None:
        self.cfg = cfg
        self.backends = backends
        self._cache: dict[str, Route] = {}

    def model_names(self) -> list[str]:
        return list(self.cfg.models)

    def resolve(self, client_model: str) -> Route:
        route = self._cache.get(client_model)
        if route is not None:
            return route
        name = cfgmod.resolve_alias(self.cfg, client_model)
        if name is None:
            available = ", ".join(sorted(self.cfg.models)) or "(none configured)"
            raise GatewayError(
                "not_found",
                f"model {client_model!r} not found; available models: {available}",
                param="model",
            )
        m = self.cfg.models[name]
        route = Route(
            client_model=client_model,
            model=name,
            upstream_model=m.upstream_model or name,
            backends=tuple(self.backends[b] for b in m.backend_names()),
            max_model_len=m.max_model_len,
        )
        if len(self._cache) < 4096:  # client names are unbounded input: cap the memo
            self._cache[client_model] = route
        return route
