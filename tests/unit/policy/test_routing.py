"""Routing (policy/routing.py): client names -> configured model -> the backend to use now."""

from __future__ import annotations

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.routing import BackendState, Router


def _router(aliases=None) -> Router:
    cfg = cfgmod.parse({
        "backends": {"a": {"url": "http://127.0.0.1:9/a/v1", "slots": 2, "health_interval_s": 7},
                     "b": {"url": "http://127.0.0.1:9/b/v1", "slots": 2, "health_interval_s": 3}},
        "models": {"big": {"backends": ["a", "b"], "upstream_model": "org/big", "affinity": False},
                   "small": {"backend": "a", "max_model_len": 4096}},
        "aliases": aliases or {"claude-*": "big", "gpt": "small"},
    })
    backends = {n: BackendState(n, b, SlotPool(n, b.slots, b.queue.depth, b.queue.timeout_s))
                for n, b in cfg.backends.items()}
    return Router(cfg, backends)


def test_names_aliases_and_globs():
    r = _router()
    assert r.resolve("big").upstream_model == "org/big"
    assert r.resolve("gpt").model == "small" and r.resolve("gpt").client_model == "gpt"
    route = r.resolve("claude-sonnet-4")
    assert (route.model, route.client_model) == ("big", "claude-sonnet-4")
    assert r.resolve("small").upstream_model == "small"  # default: the client name


def test_unknown_model_is_a_404_listing_the_models():
    with pytest.raises(GatewayError) as e:
        _router().resolve("nope")
    assert e.value.kind == "not_found" and e.value.param == "model"
    assert "available models: big, small" in e.value.message


def test_most_free_slots_then_shortest_queue():
    r = _router()
    route = r.resolve("big")
    a, b = route.backends
    assert route.choose() is a  # a tie: the first
    a.pool.in_use = 1
    assert route.choose() is b
    b.pool.in_use = 1
    b.pool.queue.queued = 1
    assert route.choose() is a


def test_all_down_fails_fast_with_the_soonest_probe_as_retry_after():
    route = _router().resolve("big")
    for b in route.backends:
        b.up, b.last_error = False, "connection refused"
    with pytest.raises(GatewayError) as e:
        route.choose()
    assert e.value.kind == "backend_down" and e.value.retry_after == 3
    assert "a: connection refused" in e.value.message
    route.backends[1].up = True
    assert route.choose() is route.backends[1]  # the one that is up


def test_context_length_from_model_then_backend_then_probe():
    r = _router()
    small = r.resolve("small")
    assert small.context_length(small.backends[0]) == 4096
    big = r.resolve("big")
    big.backends[0].model_lens["org/big"] = 32768
    assert big.context_length(big.backends[0]) == 32768
    assert big.context_length(big.backends[1]) is None


def test_the_memo_is_bounded():
    r = _router()
    for i in range(5000):
        r.resolve(f"claude-{i}")
    assert len(r._cache) == 4096
