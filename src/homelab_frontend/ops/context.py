"""What the operator endpoints see of the gateway: a Protocol, so ops need not import `app`
(which imports ops: the cycle this replaces). `app.gateway.Gateway` is the one implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from .. import config as cfgmod
from ..policy.auth import Auth
from ..policy.routing import BackendState
from ..request.tracker import Tracker

if TYPE_CHECKING:
    from .metrics import Metrics


class OpsGateway(Protocol):
    cfg: cfgmod.Config
    auth: Auth
    backends: dict[str, BackendState]
    tracker: Tracker
    metrics: Metrics
    cluster: Any  # admission.redis_leases.Registry when a `cluster:` section is configured, else None
    draining: bool

    def reload(self) -> list[str]: ...

    async def refresh_running(self) -> None: ...


OPS_GATEWAY = web.AppKey("ops_gateway", OpsGateway)


def gateway(request: web.Request) -> OpsGateway:
    return request.app[OPS_GATEWAY]
