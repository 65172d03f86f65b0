"""What a surface handler sees of the gateway: a Protocol, so surfaces need not import `app`
(which imports them). `app.gateway.Gateway` is the one implementation; a handler is called as
`fn(request, gw, t)` with `gw` of this type and `t` the request's record."""

from __future__ import annotations

from typing import Any, AsyncContextManager, Callable, Protocol, TypeVar

from aiohttp import web

from .. import config as cfgmod
from ..admission.supersede import LatestWins
from ..lifecycle.fleet import Fleet
from ..policy.auth import Auth, Principal
from ..policy.routing import BackendState, Router
from ..request.tracker import Tracked, Tracker
from ..upstream.client import UpstreamClient
from .responses.state import ResponsesState
from .signature import ThinkingSigner

T = TypeVar("T")


class Gateway(Protocol):
    cfg: cfgmod.Config
    auth: Auth
    router: Router
    backends: dict[str, BackendState]
    clients: dict[str, UpstreamClient]
    tracker: Tracker
    signer: ThinkingSigner
    responses: ResponsesState
    cluster: Any  # admission.redis_registry.Registry when a `cluster:` section is configured, else None
    supersede: LatestWins  # a client's newest completion per model (admission/supersede.py, redis_supersede.py)
    fleet: Fleet  # managed backends (`run:`): what Ollama's keep_alive and load requests act on

    async def read_body(self, request: web.Request) -> bytes: ...

    async def parse(self, body: bytes, parse: Callable[[bytes], T]) -> T: ...

    def note_body(self, request: web.Request, size: int) -> None:
        """The size of a body read by the surface itself (a relayed upload), for the ledger."""
        ...

    def headers(self, t: Tracked) -> dict[str, str]: ...

    def hold(self, principal: Principal) -> AsyncContextManager[None]: ...
