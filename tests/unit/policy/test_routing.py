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


def test_ollamas_latest_tag_means_the_untagged_name():
    r = _router()
    route = r.resolve("small:latest")  # as Ollama's clients list it, and VS Code sends it to /v1
    assert (route.model, route.client_model, route.upstream_model) == ("small", "small:latest", "small")
    assert r.resolve("gpt:latest").model == "small"  # an alias too
    with pytest.raises(GatewayError):
        r.resolve("small:q4")  # another tag is another model
    with pytest.raises(GatewayError):
        r.resolve(":latest")
    cfg = cfgmod.parse({"backends": {"a": {"url": "http://127.0.0.1:9/a/v1"}},
                        "models": {"qwen:latest": {"backend": "a"}}})
    tagged = Router(cfg, {"a": BackendState("a", cfg.backends["a"], SlotPool("a", 1, 1, 1.0))})
    assert tagged.resolve("qwen").model == "qwen:latest"  # and the other way: untagged means :latest


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
        b.up, b.last_error = False, f"backend {b.name!r} is unreachable (connection refused)"
    with pytest.raises(GatewayError) as e:
        route.choose()
    assert e.value.kind == "backend_down" and e.value.retry_after == 3
    assert e.value.message == ("model 'big' is down: backend 'a' is unreachable (connection refused); "
                               "backend 'b' is unreachable (connection refused)")
    route.backends[1].up = True
    assert route.choose() is route.backends[1]  # the one that is up


def test_a_down_backend_is_named_once_with_its_error_or_as_down_without_one():
    route = _router().resolve("small")
    (a,) = route.backends
    a.up, a.last_error = False, None  # down before any error was recorded (a managed stop, say)
    with pytest.raises(GatewayError) as e:
        route.choose()
    assert e.value.message == "model 'small' is down: backend 'a' is down"
    assert a.connection_failed("backend 'a' is unreachable (connection refused)") is False  # already down
    a.up = True
    assert any(a.connection_failed("backend 'a' is unreachable (connection refused)") for _ in range(10))
    with pytest.raises(GatewayError) as e:
        route.choose()
    assert e.value.message.count("'a'") == 1, e.value.message
    assert e.value.message.startswith("model 'small' is down: backend 'a' is unreachable (connection refused)")


def test_context_length_from_model_then_backend_then_probe():
    r = _router()
    small = r.resolve("small")
    assert small.context_length(small.backends[0]) == 4096
    big = r.resolve("big")
    big.backends[0].model_lens["org/big"] = 32768
    assert big.context_length(big.backends[0]) == 32768
    assert big.context_length(big.backends[1]) is None


def test_smallest_context_is_the_least_any_backend_holds():
    r = _router()
    big = r.resolve("big")
    assert big.smallest_context() is None  # no backend says
    big.backends[0].model_lens["org/big"] = 32768
    assert big.smallest_context() == 32768  # one unknown is no limit
    big.backends[1].model_lens["org/big"] = 8192
    assert big.smallest_context() == 8192
    assert r.resolve("small").smallest_context() == 4096


def test_the_memo_is_bounded():
    r = _router()
    for i in range(5000):
        r.resolve(f"claude-{i}")
    assert len(r._cache) == 4096


def _fallback_router() -> Router:
    cfg = cfgmod.parse({
        "backends": {"a": {"url": "http://127.0.0.1:9/a/v1"}, "b": {"url": "http://127.0.0.1:9/b/v1"},
                     "c": {"url": "http://127.0.0.1:9/c/v1", "kind": "llamacpp"}},
        "models": {"big": {"backends": ["a", "c"], "fallback": "mid"}, "mid": {"backend": "b", "fallback": "small"},
                   "small": {"backend": "a", "upstream_model": "org/small"}},
        "aliases": {"claude-*": "big"},
    })
    backends = {n: BackendState(n, b, SlotPool(n, b.slots, b.queue.depth, b.queue.timeout_s))
                for n, b in cfg.backends.items()}
    return Router(cfg, backends)


def test_a_fallback_serves_only_when_every_backend_of_the_model_is_down():
    r = _fallback_router()
    assert r.resolve("claude-x").model == "big"
    r.backends["a"].up = False
    assert r.resolve("claude-x").model == "big"  # c is still up
    r.backends["c"].up = False
    route = r.resolve("claude-x")
    assert (route.model, route.client_model, route.requested) == ("mid", "claude-x", "big")
    r.backends["b"].up = False  # mid down too: its own fallback, small, is on a (down): the chain is down
    assert r.resolve("claude-x").model == "big"  # the refusal names the model asked for
    r.backends["a"].up = True
    route = r.resolve("claude-x")
    assert (route.model, route.upstream_model, route.client_model) == ("big", "big", "claude-x")


def test_failover_alternatives_are_up_untried_and_take_the_same_request():
    r = _fallback_router()
    big = r.resolve("big")
    a, c = r.backends["a"], r.backends["c"]
    assert big.alternative(["a"], a) is None  # c streams plain answers upstream (llama.cpp): not interchangeable
    cfg = cfgmod.parse({
        "backends": {n: {"url": f"http://127.0.0.1:9/{n}/v1", "slots": 2} for n in "xyz"},
        "models": {"m": {"backends": ["x", "y", "z"]}}})
    backends = {n: BackendState(n, b, SlotPool(n, b.slots, b.queue.depth, b.queue.timeout_s))
                for n, b in cfg.backends.items()}
    m = Router(cfg, backends).resolve("m")
    x, y, z = (backends[n] for n in "xyz")
    y.pool.in_use = 1  # (the in-process pool's count, set as the exchange would)
    assert m.alternative(["x"], x) is z  # the most free slots
    z.up = False
    assert m.alternative(["x"], x) is y
    assert m.alternative(["x", "y"], y) is None
