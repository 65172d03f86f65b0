"""Cluster-wide slot use for the operator: `/metrics` gauges and the `cluster` part of
`/admin/requests`. Imported only when the config has a `cluster:` section (it imports redis)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from .. import config as cfgmod
from ..admission.redis_registry import Registry
from .context import OpsGateway


def attach(gw: OpsGateway, cfg: cfgmod.Cluster) -> Registry:
    """The registry for `gw`'s pools, with its gauges on `gw`'s metrics."""
    registry = Registry(cfg)
    gw.metrics.registry.register(_Collector(registry))
    return registry


class _Collector:
    """Read at scrape time from what the registry last saw (at most lease_s / 3 old): a scrape
    never waits on Redis."""

    def __init__(self, registry: Registry) -> None:
        self.reg = registry

    def collect(self):
        up = GaugeMetricFamily("hlf_cluster_redis_up",
                               "1 when this replica reaches the Redis that holds the shared slots.")
        up.add_metric([], 1 if self.reg.ok else 0)
        total = GaugeMetricFamily("hlf_cluster_slots_in_use",
                                  "Slots in use on the backend across all replicas.", labels=["backend"])
        by_replica = GaugeMetricFamily("hlf_cluster_replica_slots_in_use",
                                       "Slots held on the backend, by replica.", labels=["backend", "replica"])
        held = GaugeMetricFamily("hlf_cluster_slots_held_here",
                                 "Slots this replica holds on the backend.", labels=["backend"])
        for name, pool in list(self.reg.pools.items()):
            total.add_metric([name], pool.in_use)
            held.add_metric([name], pool.held)
            for replica, n in sorted(pool.holders.items()):
                if n:
                    by_replica.add_metric([name, replica], n)
        yield from (up, total, by_replica, held)


async def view(gw: OpsGateway) -> dict | None:
    """The `cluster` part of /admin/requests, read from Redis now (None without a cluster)."""
    registry = gw.cluster
    if registry is None:
        return None
    return await registry.view()
