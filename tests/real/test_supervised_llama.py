"""A managed llama-server started through a wrapper script that does not exec it (the script
waits for it and then logs its exit, as a user's wrapper does): the gateway killed with SIGKILL
leaves no process of that tree (judged by /proc, processes named by pid and start time) and the
server's port free, within a few seconds; an idle stop too, the server's own shutdown not cut
short. The stub version of this is tests/integration/test_supervised.py."""

from __future__ import annotations

import json
import signal
import textwrap

import pytest

from gwproc import Gateway, config_for
from homelab_frontend.lifecycle.supervisor import DEATH_GRACE_S
from llamaproc import ALIAS, BIN, GGUF, TEMPLATE, require_llama
from managed import backends, port_closed, wait_state
from proctree import cmdline, comm, kill_all, survivors, tree, wait_all_gone
from rawhttp import post_raw
from stubproc import free_port

pytestmark = pytest.mark.timeout(420)

GONE_WITHIN_S = DEATH_GRACE_S + 5.0  # one SIGTERM, SIGKILL after the grace; the figures printed are what it took

WRAPPER = textwrap.dedent("""\
    #!/bin/sh
    # a user's wrapper: the server as a child, not exec'd, and a line when it ends
    "$@"
    echo "wrapper: llama-server exited with $?"
""")


def wrapped_llama(tmp_path, port: int, **run) -> dict:
    script = tmp_path / "llama-wrapper.sh"
    script.write_text(WRAPPER)
    cmd = ["/bin/sh", str(script), str(BIN), "-m", str(GGUF), "--alias", ALIAS, "--host", "127.0.0.1",
           "--port", str(port), "--parallel", "2", "-c", "2048", "-t", "1", "-tb", "1", "--jinja",
           "--chat-template-file", str(TEMPLATE), "--no-warmup"]
    backend = {"url": f"http://127.0.0.1:{port}/v1", "kind": "llamacpp", "slots": 2, "health_interval_s": 1,
               "run": {"cmd": cmd, "start_timeout_s": 120, "stop_timeout_s": 10, **run}}
    return config_for({"llama": backend}, {"gemma": {"backend": "llama", "upstream_model": ALIAS}})


def ask(gw) -> None:
    status, _, raw = post_raw(gw.base + "/chat/completions",
                              {"model": "gemma", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]},
                              timeout=240)
    assert status == 200, raw
    assert json.loads(raw)["choices"][0]["message"]["content"] is not None


def llama_tree(gw) -> tuple[dict[int, int], int]:
    """The backend's tree below the gateway (supervisor, sh, llama-server) and llama-server's pid,
    which must be the wrapper's child (not exec'd by it)."""
    procs = tree(gw.proc.pid)
    wrapper = backends(gw)["llama"]["pid"]
    assert "llama-wrapper.sh" in cmdline(wrapper)
    servers = [p for p in tree(wrapper) if comm(p) == "llama-server"]
    assert len(servers) == 1 and servers[0] in procs, [(p, cmdline(p)) for p in procs]
    assert any("supervisor.py" in cmdline(p) for p in procs)
    return procs, servers[0]


def test_a_wrapper_scripts_llama_server_dies_with_the_gateways_sigkill(tmp_path):
    require_llama()
    port = free_port()
    gw = Gateway(wrapped_llama(tmp_path, port))
    procs: dict[int, int] = {}
    try:
        ask(gw)
        procs, _ = llama_tree(gw)
        assert not port_closed(port)
        gw.signal(signal.SIGKILL)
        gw.proc.wait(60)
        took = wait_all_gone(procs, GONE_WITHIN_S)
        assert port_closed(port)
        print(f"{len(procs)} processes gone {took:.3f} s after the gateway's SIGKILL")
    finally:
        gw.stop()
        kill_all(procs)


def test_an_idle_stop_of_a_wrapped_llama_server_is_its_own_clean_shutdown(tmp_path):
    require_llama()
    port = free_port()
    procs: dict[int, int] = {}
    with Gateway(wrapped_llama(tmp_path, port, idle_ttl_s=2)) as gw:
        try:
            ask(gw)
            procs, server = llama_tree(gw)
            view = wait_state(gw, "llama", "stopped", timeout=120)
            assert survivors(procs) == [] and port_closed(port)
            assert view["last_exit_status"] == -signal.SIGTERM  # the wrapper's own: sh ends on the SIGTERM
            status, text = gw.get("/admin/backends/llama/log?lines=400")
            assert status == 200
            # llama-server got the one SIGTERM with its group and finished on its own (not killed)
            assert "no exit" not in text and "killed" not in text, text[-2000:]
            assert "cleaning up before exit" in text.split("-- gateway: stopping")[-1], text[-2000:]
        finally:
            kill_all(procs)
