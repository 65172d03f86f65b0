"""The cluster's operator view (ops/cluster.py): the Prometheus gauges read what the registry
last saw (a scrape never waits on Redis), and the admin view is None without a cluster."""

from __future__ import annotations

import asyncio
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest

from homelab_frontend import config as cfgmod
from homelab_frontend.ops import cluster


class _Pool:
    def __init__(self, in_use: int, held: int, holders: dict[str, int]) -> None:
        self.in_use, self.held, self.holders = in_use, held, Counter(holders)


class _Registry:
    def __init__(self, ok: bool) -> None:
        self.ok = ok
        self.pools = {"gpu0": _Pool(3, 1, {"a": 1, "b": 2, "gone": 0})}

    async def view(self) -> dict:
        return {"replica": "a"}


def test_the_gauges_are_what_the_registry_last_saw():
    reg = CollectorRegistry()
    reg.register(cluster._Collector(_Registry(ok=True)))
    text = generate_latest(reg).decode()
    assert "hlf_cluster_redis_up 1.0" in text
    assert 'hlf_cluster_slots_in_use{backend="gpu0"} 3.0' in text
    assert 'hlf_cluster_slots_held_here{backend="gpu0"} 1.0' in text
    assert 'hlf_cluster_replica_slots_in_use{backend="gpu0",replica="b"} 2.0' in text
    assert 'replica="gone"' not in text  # a replica holding nothing is not a series
    down = CollectorRegistry()
    down.register(cluster._Collector(_Registry(ok=False)))
    assert "hlf_cluster_redis_up 0.0" in generate_latest(down).decode()


def test_attach_registers_the_gauges_and_view_is_none_without_a_cluster():
    class _Metrics:
        registry = CollectorRegistry()

    class _Gw:
        tracker: list = []
        metrics = _Metrics()
        cluster = None

    gw = _Gw()
    registry = cluster.attach(gw, cfgmod.Cluster(redis_url="redis://127.0.0.1:1/0", lease_s=3))
    assert registry.pools == {} and "hlf_cluster_redis_up 0.0" in generate_latest(gw.metrics.registry).decode()
    assert asyncio.run(cluster.view(gw)) is None
    gw.cluster = _Registry(ok=True)
    assert asyncio.run(cluster.view(gw)) == {"replica": "a"}
