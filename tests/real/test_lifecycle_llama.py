"""Managed llama-servers (the real binary, the real Gemma 3 270M GGUF), started, swapped and
stopped by the gateway itself: two backends that cannot run together (each `uses` the whole of
`resources`). Judged by llama.cpp's own evidence (its stop reason, its log's per-request token
count, its pid and port) and by the processes this test knows, never by a machine-wide pgrep:
other llama-servers run on this machine."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from gwproc import Gateway, config_for
from llamaproc import ALIAS, BIN, GGUF, TEMPLATE, require_llama
from managed import alive, backends, group_members, port_closed, wait_gone, wait_state
from rawhttp import post_raw, sse_events, stream_on_thread
from stubproc import free_port, wait_for

pytestmark = pytest.mark.timeout(420)


def llama_backend(port: int, *, model: str = str(GGUF), **run) -> dict:
    cmd = [str(BIN), "-m", model, "--alias", ALIAS, "--host", "127.0.0.1", "--port", str(port),
           "--parallel", "2", "-c", "2048", "-t", "1", "-tb", "1", "--metrics", "--slots", "--jinja",
           "--chat-template-file", str(TEMPLATE), "--no-warmup"]
    return {"url": f"http://127.0.0.1:{port}/v1", "kind": "llamacpp", "slots": 2, "health_interval_s": 1,
            "run": {"cmd": cmd, "uses": {"gpu": 1}, "start_timeout_s": 120, "stop_timeout_s": 10, **run}}


def two_llamas(**b_run) -> tuple[dict, int, int]:
    pa, pb = free_port(), free_port()
    cfg = config_for({"a": llama_backend(pa), "b": llama_backend(pb, **b_run)},
                     {"gemma-a": {"backend": "a", "upstream_model": ALIAS},
                      "gemma-b": {"backend": "b", "upstream_model": ALIAS}},
                     resources={"gpu": 1})
    return cfg, pa, pb


def chat(gw, model, content="Say hello.", max_tokens=16, stream=False, timeout=240):
    body = {"model": model, "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return post_raw(gw.base + "/chat/completions", body, timeout=timeout)


def predicted_in_log(gw, name: str) -> list[int]:
    """llama.cpp's own count of the tokens it generated per request, from its log (which the
    gateway keeps after the process exited): the `eval time = ... / N tokens` lines."""
    status, text = gw.get(f"/admin/backends/{name}/log?lines=5000")
    assert status == 200
    return [int(n) for n in re.findall(r"(?<!prompt )eval time =\s+[\d.]+ ms /\s+(\d+) tokens", text)]


def test_two_models_that_cannot_run_together_swap_only_after_the_long_stream_finishes():
    require_llama()
    cfg, pa, pb = two_llamas(idle_ttl_s=3)
    with Gateway(cfg) as gw:
        view = backends(gw)
        assert view["a"]["state"] == view["b"]["state"] == "stopped"
        assert port_closed(pa) and port_closed(pb)  # at boot neither runs

        status, _, raw = chat(gw, "gemma-a")
        assert status == 200, raw
        assert json.loads(raw)["choices"][0]["message"]["content"]
        a_pid = backends(gw)["a"]["pid"]
        assert alive(a_pid) and group_members(a_pid) == [a_pid]

        # a long stream on A; B is asked for while it runs
        out: dict = {}
        long = threading.Thread(target=lambda: out.update(a=chat(
            gw, "gemma-a", "Write a very long story about a dragon who learns to cook.", max_tokens=160, stream=True)))
        long.start()
        wait_for(lambda: backends(gw)["a"]["in_use"] == 1, 60)
        bt = threading.Thread(target=lambda: out.update(b=chat(gw, "gemma-b")))
        bt.start()
        wait_state(gw, "a", "draining", timeout=30)
        assert backends(gw)["b"]["state"] == "stopped" and port_closed(pb) and alive(a_pid)
        long.join(300)
        bt.join(300)

        status, _, raw = out["a"]
        assert status == 200
        events = [e for _, e in sse_events(raw) if isinstance(e, dict)]
        finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
        usage = [e["usage"] for e in events if e.get("usage")][-1]
        assert finish == ["length"] and usage["completion_tokens"] == 160  # A's own stop reason: all of it
        assert predicted_in_log(gw, "a")[-1] == 160  # llama.cpp's own count of what it generated for it
        assert raw.rstrip().endswith(b"data: [DONE]")

        status, _, raw = out["b"]
        assert status == 200, raw
        wait_gone(a_pid)  # A exited (it had, before B was spawned: the gateway's own order below)
        log = gw.stderr()
        assert log.index("backend a: stopping -> stopped") < log.index("backend b: stopped -> starting")
        assert port_closed(pa)
        b_pid = backends(gw)["b"]["pid"]
        assert alive(b_pid)

        # idle_ttl_s stops B: its process exits and its port closes
        wait_state(gw, "b", "stopped", timeout=60)
        wait_gone(b_pid)
        assert port_closed(pb)

        # kill -9 of A: the next request for A starts it again and is answered
        assert chat(gw, "gemma-a")[0] == 200
        a_pid = backends(gw)["a"]["pid"]
        os.kill(a_pid, signal.SIGKILL)
        assert wait_state(gw, "a", "stopped")["last_exit_status"] == -9
        status, _, raw = chat(gw, "gemma-a")
        assert status == 200, raw
        assert backends(gw)["a"]["pid"] not in (None, a_pid)


def test_a_bad_cmd_answers_503_with_the_exit_status_within_the_start_timeout():
    require_llama()
    port = free_port()
    cfg = config_for({"bad": llama_backend(port, model="/nonexistent/model.gguf", start_timeout_s=60, backoff_s=30)},
                     {"gemma": {"backend": "bad", "upstream_model": ALIAS}}, resources={"gpu": 1})
    with Gateway(cfg) as gw:
        t0 = time.monotonic()
        status, hdrs, raw = chat(gw, "gemma", timeout=90)
        assert status == 503 and time.monotonic() - t0 < 60
        msg = json.loads(raw)["error"]["message"]
        m = re.search(r"exit status (\d+)", msg)
        assert "backend 'bad' failed to start" in msg and m and int(m.group(1)) != 0, msg
        assert backends(gw)["bad"]["last_exit_status"] == int(m.group(1))
        assert int(hdrs["retry-after"]) >= 1
        # Anthropic's dialect, during the back-off: the same failure, at once
        status, hdrs, raw = post_raw(gw.base + "/messages", {"model": "gemma", "max_tokens": 8,
                                                             "messages": [{"role": "user", "content": "hi"}]})
        assert status == 503 and m.group(0) in json.loads(raw)["error"]["message"] and hdrs["retry-after"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_gateway_ending_leaves_no_llama_server_it_started(sig):
    require_llama()
    cfg, pa, _ = two_llamas()
    gw = Gateway(cfg)
    try:
        assert chat(gw, "gemma-a")[0] == 200
        pid = backends(gw)["a"]["pid"]
        assert alive(pid) and group_members(pid) == [pid]
        if sig == signal.SIGTERM:  # with a request running: drained, then the server stopped
            t = threading.Thread(target=lambda: chat(gw, "gemma-a", "Count to fifty.", max_tokens=48))
            t.start()
            wait_for(lambda: backends(gw)["a"]["in_use"] == 1, 60)
        gw.signal(sig)
        gw.proc.wait(60)
        wait_gone(pid, 20)
        assert group_members(pid) == [] and port_closed(pa)
        if sig == signal.SIGTERM:
            t.join(30)
    finally:
        gw.stop()


def test_a_stream_sees_the_load_and_a_clients_keep_alive_stops_the_real_server():
    """The real llama-server, cold: a streaming OpenAI client gets the loading comment while the
    gateway still has the backend `starting`, then its answer; the `keep_alive` it sent ("1s", as
    clients of Ollama's /v1 send it) stops the server a second after the answer (its pid gone,
    its port closed)."""
    require_llama()
    port = free_port()
    cfg = config_for({"a": llama_backend(port)}, {"gemma": {"backend": "a", "upstream_model": ALIAS}},
                     resources={"gpu": 1}, lifecycle={"loading_keepalive_s": 0.5})
    with Gateway(cfg) as gw:
        chunks, done = stream_on_thread(gw.base + "/chat/completions", {
            "model": "gemma", "stream": True, "max_tokens": 8, "keep_alive": "1s",
            "messages": [{"role": "user", "content": "Say hello."}]}, {}, timeout=240)
        wait_for(lambda: b': loading model "gemma"' in b"".join(chunks), 60)
        pid = wait_for(lambda: backends(gw)["a"]["pid"], 60)  # spawned (the comment came while it loaded)
        assert done.wait(240)
        body = b"".join(chunks)
        assert b'"content":' in body and b"data: [DONE]" in body, body[-500:]
        assert backends(gw)["a"]["idle_ttl_s"] == 1.0
        wait_state(gw, "a", "stopped", timeout=60)
        wait_gone(pid)
        assert port_closed(port)
