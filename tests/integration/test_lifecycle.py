"""Managed backends with real processes: the gateway starts, swaps, stops and restarts stub
servers (started by the gateway itself from `run.cmd`), judged by the processes' own evidence
(pids, ports, the stub's own log) as much as by the admin view."""

from __future__ import annotations

import json
import re
import os
import signal
import threading
import time

import pytest

from gwproc import Gateway, config_for
from managed import alive, backends, group_members, port_closed, stub_backend, wait_gone, wait_state
from rawhttp import post_raw, sse_events
from stubproc import free_port, start_stub, wait_for


def chat(gw, model, prompt="hi", stream=False, dialect="openai", timeout=60):
    if dialect == "anthropic":
        return post_raw(gw.base + "/messages", {"model": model, "stream": stream, "max_tokens": 512,
                                                "messages": [{"role": "user", "content": prompt}]}, timeout=timeout)
    if dialect == "responses":
        return post_raw(gw.base + "/responses", {"model": model, "stream": stream, "store": False,
                                                 "input": prompt}, timeout=timeout)
    return post_raw(gw.base + "/chat/completions", {"model": model, "stream": stream,
                                                    "messages": [{"role": "user", "content": prompt}]},
                    timeout=timeout)


def two(a_args=(), b_args=(), *, extra=None, a_run=None, b_run=None, flavour="vllm"):
    """Two managed stubs that cannot run together (each uses the whole GPU)."""
    return config_for(
        {"a": stub_backend(flavour, *a_args, model="ma", **(a_run or {})),
         "b": stub_backend(flavour, *b_args, model="mb", **(b_run or {}))},
        {"ma": {"backend": "a"}, "mb": {"backend": "b"}},
        resources={"gpu": 1}, **(extra or {}))


def test_started_on_demand_answered_then_swapped_only_after_the_running_stream_ends():
    with Gateway(two(("--start-delay-s", "0.5", "--token-delay-ms", "30"), ("--start-delay-s", "0.5"))) as gw:
        view = backends(gw)
        assert view["a"]["state"] == view["b"]["state"] == "stopped" and view["a"]["pid"] is None
        status, _, raw = chat(gw, "ma")
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"]
        a = backends(gw)["a"]
        assert a["state"] == "ready" and alive(a["pid"]) and a["last_start_s"] > 0

        # a long stream on a; b is asked for meanwhile: it waits, a's stream finishes whole
        result = {}
        long = threading.Thread(target=lambda: result.update(a=chat(gw, "ma", "[stub content=60]", stream=True)))
        long.start()
        wait_for(lambda: backends(gw)["a"]["in_use"] == 1, 10)
        t = threading.Thread(target=lambda: result.update(b=chat(gw, "mb")))
        t.start()
        wait_state(gw, "a", "draining")
        assert backends(gw)["b"]["state"] == "stopped" and alive(a["pid"])  # not before a's stream ends
        long.join(30)
        t.join(30)
        status, _, raw = result["a"]
        events = sse_events(raw)
        finish = [e for _, e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")]
        assert status == 200 and finish[-1]["choices"][0]["finish_reason"] == "stop"
        text = "".join((e["choices"][0]["delta"].get("content") or "") for _, e in events
                       if isinstance(e, dict) and e.get("choices"))
        assert len(text.split()) == 60  # whole: every token the stub generated
        assert result["b"][0] == 200
        assert not alive(a["pid"])
        view = backends(gw)
        assert view["a"]["state"] == "stopped" and view["a"]["last_exit_status"] is not None
        assert view["b"]["state"] == "ready"
        log = gw.stderr()
        # a's process had exited before b's was spawned
        assert log.index("backend a: stopping -> stopped") < log.index("backend b: stopped -> starting")


def test_waiting_for_a_load_shows_phase_loading_and_the_queue_timeout_does_not_run():
    cfg = config_for({"a": {**stub_backend("vllm", "--start-delay-s", "2"), "queue": {"timeout_s": 0.5}}},
                     {"m": {"backend": "a"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        result = {}
        t = threading.Thread(target=lambda: result.update(r=chat(gw, "m")))
        t.start()
        wait_for(lambda: [r["phase"] for r in gw.admin()["requests"]] == ["loading"], 10)
        t.join(30)
        assert result["r"][0] == 200  # waited ~2 s with a queue timeout of 0.5 s
        line = [entry for entry in gw.access_log() if entry.get("model") == "m"][-1]
        assert line["outcome"] == "ok"


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_a_failed_start_answers_at_once_with_503_naming_backend_exit_status_and_log(dialect):
    # loading_keepalive_s 0: a stream waiting for the load gets no early headers, so its refusal is
    # a status (with them, an in-stream error: tests/integration/test_loading.py)
    cfg = config_for({"a": stub_backend("vllm", "--exit-at-start", "3", backoff_s=30)},
                     {"m": {"backend": "a"}}, resources={"gpu": 1}, lifecycle={"loading_keepalive_s": 0})
    with Gateway(cfg) as gw:
        t0 = time.monotonic()
        status, hdrs, raw = chat(gw, "m", dialect=dialect, stream=True)
        assert time.monotonic() - t0 < 20
        assert status == 503, raw
        doc = json.loads(raw)
        msg = doc["error"]["message"] if dialect != "anthropic" else doc["error"]["message"]
        assert "backend 'a'" in msg and "exit status 3" in msg and "failed to load model" in msg
        if dialect == "anthropic":
            assert doc["type"] == "error"
        assert int(hdrs["retry-after"]) >= 1
        view = backends(gw)["a"]
        assert view["state"] == "failed" and view["last_exit_status"] == 3
        # in the back-off: the same 503 at once, with Retry-After, and no new start
        status, hdrs, raw = chat(gw, "m", dialect=dialect)
        assert status == 503 and "exit status 3" in raw.decode() and int(hdrs["retry-after"]) >= 1
        status, doc = gw.get("/metrics")
        assert 'hlf_backend_starts_total{backend="a",outcome="exit"} 1.0' in doc


def test_a_start_that_never_gets_ready_fails_within_start_timeout():
    cfg = config_for({"a": stub_backend("llamacpp", "--start-delay-s", "60", start_timeout_s=1.5, backoff_s=30)},
                     {"m": {"backend": "a"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        t0 = time.monotonic()
        status, _, raw = chat(gw, "m")
        assert status == 503 and "not ready within 1.5 s" in raw.decode()
        assert time.monotonic() - t0 < 15
        view = backends(gw)["a"]
        assert view["state"] == "failed" and view["pid"] is None


def test_start_failure_on_demand_then_recovery_after_the_back_off(tmp_path):
    flag = tmp_path / "fail"
    flag.write_text("7")
    cfg = config_for({"a": stub_backend("vllm", "--exit-at-start-file", str(flag), backoff_s=1)},
                     {"m": {"backend": "a"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        status, _, raw = chat(gw, "m")
        assert status == 503 and "exit status 7" in raw.decode()
        flag.unlink()
        time.sleep(1.2)
        status, _, raw = chat(gw, "m")
        assert status == 200, raw
        assert backends(gw)["a"]["state"] == "ready"


def test_idle_ttl_stops_it_and_its_port_closes():
    backend = stub_backend("vllm", idle_ttl_s=1)
    port = int(backend["url"].rsplit(":", 1)[1].split("/")[0])
    with Gateway(config_for({"a": backend}, {"m": {"backend": "a"}}, resources={"gpu": 1})) as gw:
        assert chat(gw, "m")[0] == 200
        pid = backends(gw)["a"]["pid"]
        wait_state(gw, "a", "stopped", timeout=15)
        wait_gone(pid)
        assert port_closed(port)


def test_a_server_killed_while_ready_is_started_again_by_the_next_request():
    with Gateway(config_for({"a": stub_backend("vllm")}, {"m": {"backend": "a"}}, resources={"gpu": 1})) as gw:
        assert chat(gw, "m")[0] == 200
        pid = backends(gw)["a"]["pid"]
        os.kill(pid, signal.SIGKILL)
        view = wait_state(gw, "a", "stopped")
        assert view["last_exit_status"] == -9
        status, _, _ = chat(gw, "m")
        assert status == 200
        assert backends(gw)["a"]["pid"] not in (None, pid)


def test_vllm_sleep_instead_of_stop_and_wake_is_faster_than_a_cold_start():
    # a's cold start is what its wake is compared with; b's only makes a sleep (and is put to sleep)
    cfg = two(("--start-delay-s", "2", "--wake-delay-s", "0.2"), ("--start-delay-s", "0.5", "--wake-delay-s", "0.2"),
              a_run={"unload": "sleep"}, b_run={"unload": "sleep"})
    with Gateway(cfg) as gw:
        assert chat(gw, "ma")[0] == 200
        a = backends(gw)["a"]
        cold = a["last_start_s"]
        assert chat(gw, "mb")[0] == 200  # a sleeps to make room for b
        view = backends(gw)
        assert view["a"]["state"] == "sleeping" and alive(a["pid"]) and view["a"]["pid"] == a["pid"]
        import urllib.request
        root = cfg["backends"]["a"]["url"][:-3]
        with urllib.request.urlopen(root + "/is_sleeping", timeout=5) as r:
            assert json.loads(r.read()) == {"is_sleeping": True}
        assert chat(gw, "ma")[0] == 200  # b sleeps, a wakes
        view = backends(gw)
        assert view["a"]["state"] == "ready" and view["a"]["pid"] == a["pid"]  # the same process
        assert view["b"]["state"] == "sleeping"
        assert view["a"]["last_start_s"] < cold / 2
        with urllib.request.urlopen(root + "/is_sleeping", timeout=5) as r:
            assert json.loads(r.read()) == {"is_sleeping": False}


def test_admin_start_stop_log_and_their_refusals():
    cfg = config_for({"a": stub_backend("vllm"), "ext": {"url": "http://127.0.0.1:9/v1"}},
                     {"m": {"backend": "a"}}, resources={"gpu": 1},
                     auth={"admin_key_env": "HLF_TEST_ADMIN"})
    admin = {"authorization": "Bearer s3cret"}
    with Gateway(cfg, env={"HLF_TEST_ADMIN": "s3cret"}) as gw:
        assert gw.get("/admin/backends")[0] == 401
        assert gw.post("/admin/backends/a/start")[0] == 401
        view = backends(gw, admin)
        assert view["ext"]["state"] == "external" and view["ext"]["managed"] is False
        status, doc = gw.post("/admin/backends/a/start", headers=admin)
        assert status == 202
        wait_for(lambda: backends(gw, admin)["a"]["state"] == "ready", 20)
        pid = backends(gw, admin)["a"]["pid"]
        status, text = gw.get("/admin/backends/a/log?lines=50", admin)
        assert status == 200 and f"pid {pid}" in text and "listening on" in text
        status, doc = gw.post("/admin/backends/a/stop", headers=admin)
        assert status == 202
        wait_for(lambda: backends(gw, admin)["a"]["state"] == "stopped", 20)
        wait_gone(pid)
        assert gw.post("/admin/backends/nope/start", headers=admin)[0] == 404
        assert gw.post("/admin/backends/ext/stop", headers=admin)[0] == 409
        assert gw.get("/admin/backends/a/log?lines=x", admin)[0] == 400


def test_preload_starts_at_boot():
    with Gateway(config_for({"a": stub_backend("vllm", preload=True)}, {"m": {"backend": "a"}},
                            resources={"gpu": 1})) as gw:
        wait_state(gw, "a", "ready")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_child_outlives_the_gateway(sig):
    cfg = config_for({"a": stub_backend("vllm", uses=0.5, model="ma"), "b": stub_backend("llamacpp", uses=0.5, model="mb")},
                     {"ma": {"backend": "a"}, "mb": {"backend": "b"}}, resources={"gpu": 1})
    gw = Gateway(cfg)
    try:
        assert chat(gw, "ma")[0] == 200 and chat(gw, "mb")[0] == 200
        pids = [b["pid"] for b in backends(gw).values()]
        assert all(pids) and all(alive(p) for p in pids)
        assert all(group_members(p) == [p] for p in pids)  # each in a process group of its own
        gw.signal(sig)
        gw.proc.wait(20)
        for p in pids:
            wait_gone(p, 10)
            assert group_members(p) == []
    finally:
        gw.stop()


def test_reload_restarts_a_changed_backend_once_idle_and_stops_a_removed_one():
    a, b = stub_backend("vllm", uses=0.5, model="ma"), stub_backend("vllm", uses=0.5, model="mb")
    cfg = config_for({"a": a, "b": b}, {"ma": {"backend": "a"}, "mb": {"backend": "b"}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        assert chat(gw, "ma")[0] == 200 and chat(gw, "mb")[0] == 200
        pa, pb = backends(gw)["a"]["pid"], backends(gw)["b"]["pid"]
        result = {}
        t = threading.Thread(target=lambda: result.update(r=chat(gw, "ma", "[stub content=40 delay_ms=30]", stream=True)))
        t.start()
        wait_for(lambda: backends(gw)["a"]["in_use"] == 1, 10)
        a2 = {**a, "run": {**a["run"], "cmd": a["run"]["cmd"] + ["--token-delay-ms", "1"]}}
        gw.write_config(config_for({"a": a2}, {"ma": {"backend": "a"}}, resources={"gpu": 1}))
        status, doc = gw.post("/admin/reload")
        assert status == 200 and doc["reloaded"], doc
        wait_gone(pb)  # removed, idle: stopped
        assert alive(pa)  # changed, but busy: its stream goes on
        t.join(30)
        status, _, raw = result["r"]
        assert status == 200 and b"[DONE]" in raw
        wait_gone(pa)
        assert chat(gw, "ma")[0] == 200  # started again with the new command
        view = backends(gw)
        assert view["a"]["pid"] not in (None, pa) and "b" not in view


def test_a_streaming_anthropic_client_gets_no_headers_while_its_backend_loads_when_loading_keepalives_are_off():
    import socket

    from rawhttp import _request_bytes
    cfg = config_for({"a": stub_backend("vllm", "--start-delay-s", "2")}, {"m": {"backend": "a"}},
                     resources={"gpu": 1}, lifecycle={"loading_keepalive_s": 0})
    with Gateway(cfg) as gw:
        addr, req = _request_bytes(gw.base + "/messages", {
            "model": "m", "stream": True, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(req)
            wait_for(lambda: [r["phase"] for r in gw.admin()["requests"]] == ["loading"], 10)
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(1)  # nothing yet, not even a status line: a refusal could still be a 529
            s.settimeout(30)
            got = b""
            while b"message_stop" not in got:
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
        assert got.startswith(b"HTTP/1.1 200")


def test_a_client_that_leaves_while_its_backend_loads_is_cancelled_loading_and_leaves_the_queue():
    from rawhttp import post_and_vanish
    cfg = config_for({"a": stub_backend("vllm", "--start-delay-s", "3")}, {"m": {"backend": "a"}},
                     resources={"gpu": 1})
    with Gateway(cfg) as gw:
        post_and_vanish(gw.base + "/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, after_s=1.0)
        wait_for(lambda: any(e.get("outcome") == "cancelled_loading" for e in gw.access_log()), 10)
        assert backends(gw)["a"]["waiting"] == 0 and gw.admin()["requests"] == []
        wait_state(gw, "a", "ready")  # the start it asked for goes on: the next request finds it ready
        assert chat(gw, "m")[0] == 200


def test_lifecycle_metrics_after_a_swap():
    with Gateway(two(("--start-delay-s", "0.5"), ("--start-delay-s", "0.5"))) as gw:
        assert chat(gw, "ma")[0] == 200 and chat(gw, "mb")[0] == 200
        status, text = gw.get("/metrics")
        assert status == 200
        assert 'hlf_backend_swaps_total{backend="a"} 1.0' in text
        assert 'hlf_backend_swaps_total{backend="b"} 0.0' in text
        assert 'hlf_backend_state{backend="b",state="ready"} 1.0' in text
        assert 'hlf_backend_state{backend="a",state="stopped"} 1.0' in text
        assert 'hlf_backend_starts_total{backend="a",outcome="ok"} 1.0' in text
        assert 'hlf_backend_start_seconds_count{backend="b"} 1.0' in text
        waited = float(re.search(r'hlf_backend_load_wait_seconds_total\{backend="b"\} ([\d.e+-]+)', text).group(1))
        assert waited > 0.4  # the request for b waited through b's load


def test_a_server_that_dies_mid_stream_ends_the_stream_with_an_error_frees_its_slot_and_restarts():
    import socket

    from rawhttp import _dechunk, _request_bytes, sse_data
    with Gateway(config_for({"a": stub_backend("vllm", "--token-delay-ms", "50")}, {"m": {"backend": "a"}},
                            resources={"gpu": 1})) as gw:
        assert chat(gw, "m")[0] == 200
        pid = backends(gw)["a"]["pid"]
        addr, req = _request_bytes(gw.base + "/chat/completions", {
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "[stub content=200]"}]})
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(req)
            got = b""
            while got.count(b"data:") < 4:
                chunk = s.recv(65536)
                assert chunk, got
                got += chunk
            os.kill(pid, signal.SIGKILL)
            while chunk := s.recv(65536):
                got += chunk
        data = sse_data(_dechunk(got.partition(b"\r\n\r\n")[2]))
        assert b"[DONE]" not in data and b'"error"' in data[-1], data[-2:]
        view = wait_state(gw, "a", "stopped")
        assert view["in_use"] == 0 and view["last_exit_status"] == -9
        assert chat(gw, "m")[0] == 200 and backends(gw)["a"]["pid"] not in (None, pid)


def test_a_stranger_on_the_backends_port_is_never_taken_for_its_server():
    """Another program (here a stub the gateway did not start) answers at a managed backend's
    address: the start fails naming it, without spawning (the new server could not bind, and
    the probe would take the stranger for it), and no request reaches the stranger; once the
    port is free the next start is the gateway's own server."""
    port = free_port()
    cfg = config_for({"a": stub_backend("vllm", port=port, uses=None, model="ma", start_timeout_s=1, backoff_s=1)},
                     {"ma": {"backend": "a"}})
    with start_stub("vllm", "--model", "ma", "--port", str(port)) as stranger, Gateway(cfg) as gw:
        status, _, raw = chat(gw, "ma")
        assert status == 503 and "already answers" in json.loads(raw)["error"]["message"], raw
        view = backends(gw)["a"]
        assert view["state"] == "failed" and view["pid"] is None and "already answers" in view["error"]
        assert stranger.requests() == []
        _, text = gw.get("/admin/backends/a/log?lines=50")
        assert f"http://127.0.0.1:{port}/v1 already answers: waiting for it to be free" in text
        assert 'hlf_backend_starts_total{backend="a",outcome="port_in_use"} 1.0' in gw.get("/metrics")[1]
        stranger.stop()
        wait_for(lambda: chat(gw, "ma")[0] == 200, 30)
        view = backends(gw)["a"]
        assert view["state"] == "ready" and alive(view["pid"])
