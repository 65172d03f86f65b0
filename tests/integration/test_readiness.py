"""`/readyz` tells the truth about managed backends: one that is stopped is ready (a request starts
it), one whose server failed to start is not, and the body says why. Judged against a managed stub
whose command exits at start (the gateway's own start of it, not a flag set by the test)."""

from __future__ import annotations

import json

from gwproc import Gateway, config_for
from managed import backends, stub_backend, wait_state
from rawhttp import post_raw
from stubproc import start_stub


def chat(gw, model: str) -> tuple[int, dict, bytes]:
    return post_raw(gw.base + "/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                    timeout=60)


def failing() -> dict:
    return stub_backend("vllm", "--exit-at-start", "3", backoff_s=30)


def test_a_managed_backend_that_cannot_start_makes_the_gateway_not_ready_and_says_why():
    cfg = config_for({"a": failing()}, {"m": {"backend": "a"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        assert backends(gw)["a"]["state"] == "stopped"
        status, doc = gw.get("/readyz")
        assert (status, doc) == (200, {"ready": True, "backends": {"a": True}})  # startable on demand
        status, _, raw = chat(gw, "m")
        assert status == 503, raw
        error = json.loads(raw)["error"]["message"]
        view = wait_state(gw, "a", "failed")
        assert view["last_exit_status"] == 3
        status, doc = gw.get("/readyz")
        assert status == 503 and doc["ready"] is False and doc["backends"] == {"a": False}
        assert doc["why"]["a"] == view["error"] == error and "exit status 3" in doc["why"]["a"]


def test_another_backend_that_can_serve_keeps_the_gateway_ready_naming_the_failed_one():
    with start_stub("vllm", "--model", "p") as plain:
        cfg = config_for({"a": failing(), "plain": plain.base}, {"m": {"backend": "a"}, "p": {"backend": "plain"}},
                         resources={"gpu": 1})
        with Gateway(cfg) as gw:
            assert chat(gw, "m")[0] == 503
            wait_state(gw, "a", "failed")
            status, doc = gw.get("/readyz")
            assert status == 200 and doc["backends"] == {"a": False, "plain": True}
            assert "exit status 3" in doc["why"]["a"]
            assert chat(gw, "p")[0] == 200
