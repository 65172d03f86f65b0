"""Backend health (ops/health.py): the context lengths a /v1/models answer gives, which failures
are late, and the probe against a real aiohttp server on 127.0.0.1: up or down, the models'
context lengths, the kind detected, the backend's own running count read off its /metrics."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiohttp import web

from support.local_http import serve
from support.models_answers import LLAMA_MODELS, VLLM_MODELS

from homelab_frontend.config import Backend
from homelab_frontend.errors import GatewayError
from homelab_frontend.ops import health
from homelab_frontend.ops.health import context_lengths
from homelab_frontend.upstream.client import UpstreamClient, UpstreamFailure


def test_context_lengths_from_vllm_and_llama_cpp():
    assert context_lengths(LLAMA_MODELS) == {"gemma-3-270m": 1024}
    assert context_lengths(VLLM_MODELS) == {"m": 4096}
    assert context_lengths({"data": [{"id": "x", "meta": {"n_ctx": "big"}}, "junk"]}) == {}


def test_only_a_missed_deadline_is_late():
    assert health.is_late(UpstreamFailure("upstream_unreachable", "x", cause="timeout"))
    assert health.is_late(UpstreamFailure("upstream_unreachable", "x", cause="connect_timeout"))
    assert not health.is_late(UpstreamFailure("upstream_unreachable", "x", cause="unreachable"))
    assert not health.is_late(UpstreamFailure("upstream_error", "x", cause="reset"))
    assert not health.is_late(GatewayError("upstream_error", "backend 'a' answered 500 to /models"))


def state_of(url: str, **cfg) -> SimpleNamespace:
    """The fields of a BackendState (policy/routing.py) that a probe reads and sets."""
    return SimpleNamespace(name="gpu0", cfg=Backend(url=url, **cfg), up=True, last_error=None, model_lens={},
                           auto_kind=False, detected_kind=None, upstream_running=None, upstream_running_at=None)


def probe(routes: list[web.RouteDef], check, **cfg) -> None:
    async def main() -> None:
        async with serve(*routes) as url:
            state = state_of(url, **cfg)
            client = UpstreamClient("gpu0", state.cfg)
            try:
                await check(state, client)
            finally:
                await client.close()

    asyncio.run(main())


def _json(doc):
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(doc)
    return handler


def _text(text: str, status: int = 200):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text, status=status)
    return handler


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
"""


def test_a_vllm_probe_learns_the_context_lengths_and_the_running_count():
    async def check(state, client) -> None:
        state.up, state.last_error = False, "backend 'gpu0' is unreachable (connection refused)"
        assert await health.probe(state, client) == VLLM_MODELS
        assert state.up and state.last_error is None and state.model_lens == {"m": 4096}
        assert state.upstream_running == 3 and state.upstream_running_at is not None
        assert health.reads_running(state)

    probe([web.get("/v1/models", _json(VLLM_MODELS)), web.get("/metrics", _text(METRICS))], check, kind="vllm")


def test_a_backend_without_metrics_has_no_running_count_but_is_up():
    async def check(state, client) -> None:
        state.upstream_running, state.upstream_running_at = 9, 1.0  # an old reading is dropped
        await health.probe(state, client)
        assert state.up and state.upstream_running is None and state.upstream_running_at is None

    probe([web.get("/v1/models", _json(VLLM_MODELS))], check, kind="vllm")


def test_an_unset_kind_is_detected_from_the_model_list():
    async def check(state, client) -> None:
        state.auto_kind = True
        await health.probe(state, client)
        assert state.detected_kind == "llamacpp" and state.cfg.kind == "llamacpp"
        assert state.model_lens == {"gemma-3-270m": 1024}

    probe([web.get("/v1/models", _json(LLAMA_MODELS))], check)


def test_an_error_answer_marks_it_down_with_the_reason_and_none():
    async def check(state, client) -> None:
        assert await health.probe(state, client, late_allowed=True) is None
        assert not state.up and state.last_error == "backend 'gpu0' answered 500 to /models"

    probe([web.get("/v1/models", _text("boom", 500))], check, kind="openai")


def test_a_late_answer_is_late_only_when_allowed_and_the_backend_was_up():
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.json_response(VLLM_MODELS)

    async def check(state, client) -> None:
        assert await health.probe(state, client, late_allowed=True) is health.LATE
        assert state.up
        assert await health.probe(state, client) is None  # not allowed: down
        assert not state.up and "did not answer /models within 0.2 s" in state.last_error

    probe([web.get("/v1/models", slow)], check, kind="openai", health_interval_s=0.2)


def test_a_server_with_a_health_path_is_up_when_it_answers_there():
    async def check(state, client) -> None:
        assert await health.probe(state, client) is None and state.up and state.model_lens == {}

    probe([web.get("/health", _text("ok"))], check, kind="whispercpp")
