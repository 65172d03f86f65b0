"""What the operator endpoints see of the gateway: a Protocol, so ops need not import `app`
(which imports ops: the cycle this replaces). `app.gateway.Gateway` is the one implementation.
What they use of its metrics is declared here too (`MetricsView`, which `ops.metrics.Metrics`
implements), not imported from ops.metrics: that module reads this one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from .. import config as cfgmod
from ..lifecycle.fleet import Fleet
from ..policy.auth import Auth
from ..policy.routing import BackendState
from ..request.tracker import Tracker
from ..usage import Ledger

if TYPE_CHECKING:  # imported at run time only with a `cluster:` section
    from ..admission.redis_registry import Registry

class MetricsView(Protocol):
    registry: CollectorRegistry

    def stats(self) -> dict: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class OpsGateway(Protocol):
    cfg: cfgmod.Config
    auth: Auth
    backends: dict[str, BackendState]
    tracker: Tracker
    cluster: Registry | None  # when a `cluster:` section shares the slots through Redis
    draining: bool
    usage: Ledger | None  # None with usage.enabled: false
    fleet: Fleet  # managed backends (`run:`)

    @property
    def metrics(self) -> MetricsView: ...  # read-only here: the gateway's is an ops.metrics.Metrics

    def reload(self) -> list[str]: ...

    async def refresh_running(self) -> None: ...


OPS_GATEWAY = web.AppKey("ops_gateway", OpsGateway)


def gateway(request: web.Request) -> OpsGateway:
    return request.app[OPS_GATEWAY]
