"""A managed backend whose `cmd` forks its server instead of exec'ing it (a wrapper script, as
`uv run` or a shell script is), with a daemon beside it in a session of its own: whatever ends the
gateway or the backend, no process of that tree is left (by /proc) and the server's port is free,
within a few seconds. The server is the stub (`python -m homelab_frontend.stub`);
tests/real/test_supervised_llama.py does the same with llama-server, and
tests/real/test_managed_vllm.py with vLLM."""

from __future__ import annotations

import json
import signal
import sys
import textwrap

import pytest

from gwproc import Gateway, config_for
from homelab_frontend.lifecycle.supervisor import DEATH_GRACE_S
from managed import backends, port_closed, wait_state
from proctree import cmdline, kill_all, survivors, tree, wait_all_gone
from rawhttp import post_raw
from stubproc import free_port, wait_for

GONE_WITHIN_S = DEATH_GRACE_S + 5.0  # one SIGTERM, SIGKILL after the grace; the figures printed are what it took
KILL_GRACE_S = 1.5  # the backend's `run.kill_grace_s`, which its supervisor is given

# `$1` the stub's python, `$2` its port: the server in the background, not exec'd, then waited for
WRAPPER = textwrap.dedent("""\
    #!/bin/sh
    "$1" -m homelab_frontend.stub --flavour vllm --port "$2" --model m &
    ( setsid sleep 3600 & )
    wait
""")


def wrapped_stub(tmp_path, **run) -> tuple[dict, int]:
    script = tmp_path / "wrapper.sh"
    script.write_text(WRAPPER)
    port = free_port()
    backend = {"url": f"http://127.0.0.1:{port}/v1", "kind": "vllm", "slots": 2, "health_interval_s": 1,
               "run": {"cmd": ["/bin/sh", str(script), sys.executable, str(port)],
                       "start_timeout_s": 30, "stop_timeout_s": 5, "kill_grace_s": KILL_GRACE_S, **run}}
    return config_for({"w": backend}, {"m": {"backend": "w"}}), port


def ask(gw) -> None:
    status, _, raw = post_raw(gw.base + "/chat/completions",
                              {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert status == 200, raw
    assert json.loads(raw)["choices"][0]["message"]["content"]


def server_tree(gw) -> dict[int, int]:
    """The wrapper's whole tree below the gateway: the supervisor, sh, the stub, the daemon."""
    procs = tree(gw.proc.pid)
    lines = [cmdline(p) for p in procs]
    assert any("homelab_frontend.stub" in c for c in lines) and any(c == "sleep 3600" for c in lines), lines
    assert any("supervisor.py" in c for c in lines) and any("wrapper.sh" in c for c in lines), lines
    assert any(f"supervisor.py --grace {KILL_GRACE_S!r} -- /bin/sh" in c for c in lines), lines
    return procs


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_gateway_ending_leaves_nothing_of_a_wrapper_scripts_tree(tmp_path, sig):
    cfg, port = wrapped_stub(tmp_path)
    gw = Gateway(cfg)
    procs: dict[int, int] = {}
    try:
        ask(gw)
        procs = server_tree(gw)
        assert not port_closed(port)
        gw.signal(sig)
        gw.proc.wait(60)
        took = wait_all_gone(procs, GONE_WITHIN_S)
        assert port_closed(port)
        print(f"{len(procs)} processes gone {took:.3f} s after the gateway's {sig.name}")
    finally:
        gw.stop()
        kill_all(procs)


def test_an_idle_stop_takes_the_whole_tree_and_says_what_the_server_left(tmp_path):
    cfg, port = wrapped_stub(tmp_path, idle_ttl_s=1)
    procs: dict[int, int] = {}
    with Gateway(cfg) as gw:
        try:
            ask(gw)
            procs = server_tree(gw)
            pid = backends(gw)["w"]["pid"]
            assert "wrapper.sh" in cmdline(pid)  # the pid shown is the cmd's own, not the supervisor's
            view = wait_state(gw, "w", "stopped", timeout=60)
            assert survivors(procs) == [] and port_closed(port)  # stopped means gone
            assert view["last_exit_status"] == -signal.SIGTERM  # sh in `wait`: the one SIGTERM ends it
            status, text = gw.get("/admin/backends/w/log?lines=200")
            assert status == 200 and "-- gateway: supervisor: killed 1 process(es) the server left behind" in text
            # and started again on demand, as before
            ask(gw)
            wait_for(lambda: backends(gw)["w"]["pid"] not in (None, pid), 10)
        finally:
            kill_all(procs)
