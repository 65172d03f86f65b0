"""A peer's report applied to its backends here (app/peers.py), and routes over them (pure: no
sockets; the integration tests run three real gateways)."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.app import peers
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.routing import BackendState, PeerLink, Router


def _entry(mid, *backends, state="loaded"):
    return {"id": mid, "owned_by": "homelab-frontend", "context_length": 2048, "capabilities": ["completion"],
            "homelab": {"state": state, "backends": [dict(b) for b in backends]}}


def _b(name, state="loaded", slots=2, eta=None):
    return {"name": name, "state": state, "slots": slots, **({"load_eta_s": eta} if eta is not None else {})}


def _setup(cfg_extra=None):
    cfg = cfgmod.parse({"backends": {"box1": {"url": "http://127.0.0.1:9/llm/v1", "kind": "peer"},
                                     "box2": {"url": "http://127.0.0.1:8/llm/v1", "kind": "peer",
                                              **(cfg_extra or {})}}})
    backends = {n: BackendState(n, b, SlotPool(n, b.slots, b.queue.depth, b.queue.timeout_s), peer=PeerLink(n))
                for n, b in cfg.backends.items()}
    return cfg, backends, {}


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _apply(cfg, backends, clients, name, *entries):
    gone = []

    def drop(n):
        b = backends[n]
        if b.pool.in_use or b.pool.queued:
            return False
        del backends[n]
        clients.pop(n, None)
        gone.append(n)
        return True

    changed = peers.reconcile(backends[name], {"data": list(entries)}, backends, clients, drop)
    return changed, gone


def test_the_peers_backends_come_with_its_slots_and_go_when_it_stops_reporting_them():
    cfg, backends, clients = _setup()
    changed, _ = _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0", slots=3)), _entry("q", _b("gpu1")))
    assert changed and backends["box1/gpu0"].pool.slots == 3 and backends["box1/gpu1"].pool.slots == 2
    assert backends["box1/gpu0"].model_lens == {"r1": 2048}
    router = Router(cfg, backends)
    assert router.model_names() == ["q", "r1"]
    assert [b.name for b in router.resolve("r1").backends] == ["box1/gpu0"]
    # a resize needs no new route; a backend that goes does
    changed, _ = _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0", slots=5)), _entry("q", _b("gpu1")))
    assert not changed and backends["box1/gpu0"].pool.slots == 5
    changed, gone = _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0", slots=5)))
    assert changed and gone == ["box1/gpu1"]
    with pytest.raises(GatewayError) as err:
        Router(cfg, backends).resolve("q")
    assert err.value.kind == "not_found"


def test_a_backend_the_peer_reports_down_is_down_here_naming_the_peer():
    cfg, backends, clients = _setup()
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0", state="failed"), state="failed"))
    child = backends["box1/gpu0"]
    assert not child.up and child.last_error == "backend 'box1/gpu0' is down: its peer 'box1' reports it failed"
    with pytest.raises(GatewayError) as err:
        Router(cfg, backends).resolve("r1").choose()
    assert err.value.kind == "backend_down" and "box1/gpu0" in err.value.message


def test_loaded_first_then_spill_over_when_waiting_would_take_longer(loop):
    cfg, backends, clients = _setup({"peer": {"start_penalty_s": 1.0}})
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0", slots=1)))
    _apply(cfg, backends, clients, "box2", _entry("r1", _b("gpu0", state="stopped", slots=4, eta=5.0), state="stopped"))
    route = Router(cfg, backends).resolve("r1")
    hot, cold = backends["box1/gpu0"], backends["box2/gpu0"]
    assert route.choose() is hot  # loaded, a slot free: even though the other has four
    lease = loop.run_until_complete(hot.pool.acquire("k", 0))
    assert hot.free == 0
    hot.pool.queue.hold_s = 2.0  # a slot there frees in about 2 s: less than 5 s + 1 s to start the other
    assert route.choose() is hot
    hot.pool.queue.hold_s = 60.0  # a long wait: the other box starts it
    assert route.choose() is cold
    hot.pool.release(lease)


def test_restricted_and_shadowed_peer_models():
    cfg, backends, clients = _setup()
    cfg = cfgmod.parse({"backends": {"box1": {"url": "http://127.0.0.1:9/llm/v1", "kind": "peer",
                                              "peer": {"models": ["r*"]}}},
                        "models": {"mine": {"backend": "box1", "upstream_model": "q"}},
                        "aliases": {"fast": "r1"}})
    backends = {"box1": BackendState("box1", cfg.backends["box1"], SlotPool("box1", 8, 32, 60), peer=PeerLink("box1"))}
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0")), _entry("q", _b("gpu1")))
    router = Router(cfg, backends)
    assert router.model_names() == ["mine", "r1"]  # q only under the configured name
    assert [b.name for b in router.resolve("mine").backends] == ["box1/gpu1"]
    assert router.resolve("fast").upstream_model == "r1"  # an alias onto a peer's model
    with pytest.raises(GatewayError):
        router.resolve("q")


def test_a_configured_model_on_a_peer_that_has_not_reported_is_the_peer_itself():
    cfg = cfgmod.parse({"backends": {"box1": {"url": "http://127.0.0.1:9/llm/v1", "kind": "peer"}},
                        "models": {"r1": {"backend": "box1"}}})
    backends = {"box1": BackendState("box1", cfg.backends["box1"], SlotPool("box1", 8, 32, 60), peer=PeerLink("box1"))}
    assert [b.name for b in Router(cfg, backends).resolve("r1").backends] == ["box1"]


def test_a_peer_down_takes_its_backends_with_it():
    cfg, backends, clients = _setup()
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0")))
    backends["box1"].up, backends["box1"].last_error = False, "connection refused"
    peers.mark_down(backends["box1"], backends)
    assert not backends["box1/gpu0"].up
    assert backends["box1/gpu0"].last_error == "backend 'box1/gpu0' is down with its peer: connection refused"


def test_a_model_moving_between_the_peers_backends_remakes_its_route():
    cfg, backends, clients = _setup()
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0")), _entry("q", _b("gpu1")))
    changed, gone = _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu1")), _entry("q", _b("gpu0")))
    assert changed and not gone  # both backends stay; the models swapped places
    assert [b.name for b in Router(cfg, backends).resolve("r1").backends] == ["box1/gpu1"]


def test_a_peer_down_wakes_the_requests_waiting_on_its_backends_and_its_polls_are_noted():
    cfg, backends, clients = _setup()
    _apply(cfg, backends, clients, "box1", _entry("r1", _b("gpu0")))

    async def main():
        waiting = backends["box1/gpu0"].peer.went_down()
        assert backends["box1/gpu0"].peer.went_down() is waiting  # one event until it fires
        backends["box1"].up = False
        peers.note_poll(backends["box1"])
        peers.mark_down(backends["box1"], backends)
        assert waiting.is_set()
        assert not backends["box1/gpu0"].peer.went_down().is_set()  # the next wait waits for the next one
        link = backends["box1"].peer
        assert link.polled_at is not None and link.answered_at is None
        backends["box1"].up = True
        peers.note_poll(backends["box1"])
        assert link.answered_at == link.polled_at
    asyncio.run(main())
