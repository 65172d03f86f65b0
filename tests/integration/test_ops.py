"""Operations, with real processes: /metrics after real requests, the access log, backend health
(a stub killed and restarted on its port), hot reload (while a stream runs; a bad file; new slot
counts) and graceful shutdown on SIGTERM (streams finish within the grace, or are cancelled with
nothing left running upstream)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from conftest import QWEN, R1, standard_config
from gwproc import Gateway, config_for
from rawhttp import post_raw, sse_events
from stubproc import free_port, start_stub, wait_for

ADMIN = {"authorization": "Bearer admin-secret"}
CLIENT = {"x-api-key": "client-secret-value"}


# -- helpers --------------------------------------------------------------------------------------


def scrape(gw: Gateway, headers: dict | None = None) -> dict[tuple, float]:
    """-> {(sample name, frozenset of label items): value}, parsed by the Prometheus parser.
    The admin key is sent: /metrics needs it whenever one is configured."""
    req = urllib.request.Request(gw.url + "/metrics", headers=ADMIN if headers is None else headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["content-type"].startswith("text/plain; version=")
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def chat(gw: Gateway, prompt: str, *, model: str = "reasoning", stream: bool = True, headers=None, **extra):
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}], **extra}
    return post_raw(gw.base + "/chat/completions", body, headers=headers)


def done_ok(raw: bytes) -> bool:
    return raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw


def content_tokens(raw: bytes) -> int:
    n = 0
    for _, data in sse_events(raw):
        if isinstance(data, dict) and data.get("choices"):
            if data["choices"][0].get("delta", {}).get("content"):
                n += 1
    return n


# -- metrics and the access log -------------------------------------------------------------------


def test_metrics_and_access_log_after_real_requests(vllm_stub, ollama_stub, stubs):
    cfg = standard_config(vllm_stub.base, ollama_stub.base)
    cfg["backends"]["gpu0"]["health_interval_s"] = 0.2
    cfg["auth"] = {"keys": [{"name": "laptop", "key_env": "HLF_TEST_CLIENT_KEY"}], "admin_key_env": "HLF_TEST_ADMIN"}
    env = {"HLF_TEST_CLIENT_KEY": "client-secret-value", "HLF_TEST_ADMIN": "admin-secret"}
    with Gateway(cfg, env=env) as gw:
        secret_prompt = "zebra-marmalade-7731 [stub content=6]"
        st, h_stream, raw = chat(gw, secret_prompt, headers=CLIENT, stream_options={"include_usage": True})
        assert st == 200 and done_ok(raw)
        usage = [d["usage"] for _, d in sse_events(raw) if isinstance(d, dict) and d.get("usage")][-1]
        st, h_anth, body = post_raw(gw.base + "/messages", {
            "model": "claude-3-5-haiku-latest", "max_tokens": 64,
            "messages": [{"role": "user", "content": "[stub content=4]"}]}, headers=CLIENT)
        assert st == 200
        st, h_err, _ = chat(gw, "[stub status=503]", stream=False, headers=CLIENT)
        assert st == 503
        st, h_404, _ = chat(gw, "hi", model="no-such-model-xyz", headers=CLIENT)
        assert st == 404
        st, _, _ = chat(gw, "hi", headers={"x-api-key": "wrong"})
        assert st == 401

        m = scrape(gw)
        req = "hlf_requests_total"
        assert metric(m, req, dialect="openai", model="reasoning", backend="gpu0", outcome="ok") == 1
        # the alias resolves to the configured model: labels stay bounded by the config
        assert metric(m, req, dialect="anthropic", model=QWEN, backend="ollama", outcome="ok") == 1
        assert metric(m, req, dialect="openai", model="reasoning", backend="gpu0", outcome="error_upstream_error") == 1
        assert metric(m, req, dialect="openai", model="", backend="", outcome="error_not_found") == 1
        assert sum(v for (name, labels), v in m.items()
                   if name == req and ("outcome", "error_authentication") in labels) == 1
        assert not any("no-such-model-xyz" in str(labels) for _, labels in m)
        assert metric(m, "hlf_upstream_errors_total", backend="gpu0", kind="status") == 1
        assert metric(m, "hlf_time_to_first_token_seconds_count", backend="gpu0", model="reasoning") == 1
        assert metric(m, "hlf_time_to_first_token_seconds_bucket", backend="gpu0", model="reasoning", le="+Inf") == 1
        assert metric(m, "hlf_time_per_output_token_seconds_count", backend="gpu0", model="reasoning") == 1
        buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in m.items()
                         if name == "hlf_request_duration_seconds_bucket" and ("backend", "gpu0") in labels)
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == 2 and buckets[-1][0] == float("inf")  # cumulative
        assert metric(m, "hlf_queue_wait_seconds_count", backend="gpu0") == 2
        assert metric(m, "hlf_input_tokens_total", backend="gpu0", model="reasoning") == usage["prompt_tokens"]
        assert metric(m, "hlf_output_tokens_total", backend="gpu0", model="reasoning") == usage["completion_tokens"]
        anth_usage = json.loads(body)["usage"]
        assert metric(m, "hlf_output_tokens_total", backend="ollama", model=QWEN) == anth_usage["output_tokens"]
        assert metric(m, "hlf_backend_slots", backend="gpu0") == 8
        assert metric(m, "hlf_backend_slots", backend="ollama") == 4
        assert metric(m, "hlf_backend_slots_in_use", backend="gpu0") == 0
        assert metric(m, "hlf_backend_queued_requests", backend="gpu0") == 0
        assert metric(m, "hlf_backend_queue_capacity", backend="gpu0") == 32
        assert metric(m, "hlf_backend_up", backend="gpu0") == 1
        assert metric(m, "hlf_backend_up", backend="ollama") == 1
        # Ollama does not say how many sequences it runs: no sample rather than a made-up one
        assert metric(m, "hlf_backend_slot_mismatch", backend="ollama") is None
        assert metric(m, "process_resident_memory_bytes") > 0

        # live gauges while a stream runs, and the leaked-slot mismatch when something else
        # runs on the backend behind the gateway's back
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(chat, gw, "[stub content=150 delay_ms=20]", headers=CLIENT)
            m = wait_for(lambda: (s := scrape(gw)) and metric(s, "hlf_requests_in_flight", backend="gpu0", phase="streaming") == 1 and s)
            assert metric(m, "hlf_backend_slots_in_use", backend="gpu0") == 1
            wait_for(lambda: metric(scrape(gw), "hlf_backend_upstream_running_requests", backend="gpu0") == 1, 3)
            assert metric(scrape(gw), "hlf_backend_slot_mismatch", backend="gpu0") == 0
            behind = pool.submit(post_raw, vllm_stub.base + "/chat/completions", {
                "model": R1, "stream": True, "messages": [{"role": "user", "content": "[stub content=100 delay_ms=20]"}]})
            wait_for(lambda: metric(scrape(gw), "hlf_backend_slot_mismatch", backend="gpu0") == 1, 3)
            assert gw.admin(ADMIN)["backends"]["gpu0"]["slot_mismatch"] == 1
            assert running.result()[0] == 200 and behind.result()[0] == 200

        # the access log: one line per request, the fields an operator needs, no text, no keys
        log = {r["id"]: r for r in gw.access_log()}
        line = log[h_stream["request-id"]]
        assert line["dialect"] == "openai" and line["model"] == "reasoning" and line["backend"] == "gpu0"
        assert line["status"] == 200 and line["outcome"] == "ok" and line["stream"] is True
        assert line["key"] == "laptop"
        assert line["tokens_in"] == usage["prompt_tokens"] and line["tokens_out"] == usage["completion_tokens"]
        assert line["queue_wait_ms"] >= 0 and 0 < line["ttft_ms"] <= line["duration_ms"]
        line = log[h_anth["request-id"]]
        assert (line["dialect"], line["model"], line["backend"], line["outcome"]) == (
            "anthropic", "claude-3-5-haiku-latest", "ollama", "ok")
        assert line["ttft_ms"] is None  # not a stream
        line = log[h_err["request-id"]]
        assert (line["status"], line["outcome"]) == (503, "error_upstream_error")
        assert log[h_404["request-id"]]["outcome"] == "error_not_found"
        stderr = gw.stderr()
        assert "zebra-marmalade" not in stderr  # never message text
        assert "client-secret-value" not in stderr and "admin-secret" not in stderr  # never keys


def test_metrics_and_stats_need_no_model_text_and_stats_needs_admin(vllm_stub, ollama_stub, stubs):
    cfg = standard_config(vllm_stub.base, ollama_stub.base, auth={"admin_key_env": "HLF_TEST_ADMIN"})
    with Gateway(cfg, env={"HLF_TEST_ADMIN": "admin-secret"}) as gw:
        assert chat(gw, "[stub content=3]")[0] == 200
        status, doc = gw.get("/admin/stats")
        assert status == 401 and doc["error"]["type"] == "authentication_error"
        status, doc = gw.get("/admin/stats", ADMIN)
        assert status == 200
        assert doc["totals"]["requests"] == 1
        assert set(doc["backends"]) == {"gpu0", "ollama"}
        recent = doc["recent"][0]
        assert recent["model"] == "reasoning" and recent["outcome"] == "ok" and recent["ttft_ms"] > 0
        assert metric(scrape(gw), "hlf_requests_total", dialect="openai", model="reasoning",
                      backend="gpu0", outcome="ok") == 1


# -- health ---------------------------------------------------------------------------------------


def test_backend_killed_goes_down_and_comes_back_up_on_the_same_port(tmp_path):
    port = free_port()
    args = ("--model", "m", "--model", "solo", "--port", str(port))
    spare = start_stub("vllm", "--model", "m")
    a = start_stub("vllm", *args, log_path=tmp_path / "a.log")
    try:
        fast = {"health_interval_s": 0.2, "timeouts": {"connect_s": 1}}
        cfg = config_for(
            {"a": {"url": a.base, **fast}, "b": {"url": spare.base, **fast}},
            {"m": {"backends": ["a", "b"]}, "solo": {"backend": "a"}},
        )
        with Gateway(cfg) as gw:
            assert gw.get("/readyz")[0] == 200
            a.stop()
            wait_for(lambda: gw.get("/readyz")[1]["backends"] == {"a": False, "b": True}, 5)
            assert gw.get("/readyz")[0] == 200  # one backend is enough to be ready
            assert metric(scrape(gw), "hlf_backend_up", backend="a") == 0
            assert gw.admin()["backends"]["a"]["last_error"]
            # a model only `a` serves fails fast with a clear error in the caller's dialect...
            status, _, raw = chat(gw, "hi", model="solo", stream=False)
            assert status == 503 and b"model 'solo' is down: backend 'a' is unreachable" in raw
            status, _, raw = post_raw(gw.base + "/messages", {"model": "solo", "max_tokens": 8,
                                      "messages": [{"role": "user", "content": "hi"}]})
            assert status == 503 and b'"type":"error"' in raw.replace(b" ", b"")
            # ...and a model both serve goes to the one that is up
            spare.reset()
            for _ in range(3):
                assert chat(gw, "[stub content=2]", model="m")[0] == 200
            assert spare.stats()["completed"] == 3

            a = start_stub("vllm", *args, log_path=tmp_path / "a2.log")
            wait_for(lambda: gw.get("/readyz")[1]["backends"] == {"a": True, "b": True}, 5)
            assert metric(scrape(gw), "hlf_backend_up", backend="a") == 1
            assert chat(gw, "[stub content=2]", model="solo")[0] == 200

            a.stop()
            spare.stop()
            wait_for(lambda: gw.get("/readyz")[0] == 503, 5)
            assert gw.get("/healthz") == (200, {"status": "ok"})  # the process itself is fine
    finally:
        a.stop()
        spare.stop()


# -- hot reload -----------------------------------------------------------------------------------


def _reload_cfg(url: str, slots: int, **models) -> dict:
    return config_for({"b": {"url": url, "slots": slots}}, {"m": {"backend": "b"}, **models})


def test_reload_while_streaming_new_url_and_fewer_slots(tmp_path):
    with start_stub("vllm", "--model", "m", log_path=tmp_path / "one.log") as one, \
         start_stub("vllm", "--model", "m", log_path=tmp_path / "two.log") as two, \
         Gateway(_reload_cfg(one.base, 4)) as gw, ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(chat, gw, "[stub content=120 delay_ms=20]", model="m") for _ in range(2)]
        wait_for(lambda: one.stats()["in_flight"] == 2, 5)

        # the backend moves to another URL and shrinks to one slot while both streams run
        gw.write_config(_reload_cfg(two.base, 1, extra={"backend": "b", "upstream_model": "m"}))
        gw.signal(signal.SIGHUP)
        wait_for(lambda: gw.admin()["backends"]["b"]["slots"] == 1, 5)
        b = gw.admin()["backends"]["b"]
        assert b["in_use"] == 2  # accounting kept: both running streams still hold their slots

        queued = pool.submit(chat, gw, "[stub content=3]", model="extra")  # the new model, new URL
        wait_for(lambda: gw.admin()["backends"]["b"]["queued"] == 1, 5)
        assert two.stats()["in_flight"] == 0  # over the new limit: it waits for both to finish

        for f in streams:
            status, _, raw = f.result()
            assert status == 200 and done_ok(raw) and content_tokens(raw) == 120
        status, _, raw = queued.result()
        assert status == 200 and done_ok(raw)
        assert two.stats()["completed"] == 1 and one.stats()["completed"] == 2
        assert "cancelled" not in one.log_text()  # the old upstream connections were not cut
        wait_for(lambda: gw.admin()["backends"]["b"] == {**gw.admin()["backends"]["b"], "in_use": 0, "queued": 0})
        assert "config reloaded" in gw.stderr()
        assert metric(scrape(gw), "hlf_config_reloads_total", result="ok") == 1


def test_reload_with_a_bad_file_keeps_the_old_config(tmp_path):
    with start_stub("vllm", "--model", "m") as stub, Gateway(_reload_cfg(stub.base, 2)) as gw:
        bad = _reload_cfg(stub.base, 0)
        bad["models"]["broken"] = {"backend": "gpu9"}
        bad["surprise"] = True
        gw.write_config(bad)
        status, doc = gw.post("/admin/reload")
        assert status == 400 and doc["reloaded"] is False
        problems = "\n".join(doc["problems"])
        assert "surprise: unknown key" in problems
        assert "backends.b.slots: must be at least 1" in problems
        assert "models.broken.backend: no backend named 'gpu9'" in problems
        with open(gw.config_path, "w") as f:
            f.write("backends: [unclosed\n")
        gw.signal(signal.SIGHUP)
        wait_for(lambda: "not valid YAML" in gw.stderr(), 5)
        assert "reload rejected, old config stays" in gw.stderr()
        assert gw.admin()["backends"]["b"]["slots"] == 2  # the old config serves on
        assert chat(gw, "[stub content=2]", model="m")[0] == 200
        assert metric(scrape(gw), "hlf_config_reloads_total", result="rejected") == 2

        gw.write_config(_reload_cfg(stub.base, 3, other={"backend": "b", "upstream_model": "m"}))
        assert gw.post("/admin/reload") == (200, {"reloaded": True})
        assert gw.admin()["backends"]["b"]["slots"] == 3
        assert chat(gw, "[stub content=2]", model="other")[0] == 200


# -- graceful shutdown ----------------------------------------------------------------------------


def _refused(gw: Gateway) -> bool:
    host, port = gw.url.rsplit("/", 1)[1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def _exit_code(gw: Gateway, timeout: float) -> int:
    try:
        return gw.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the gateway did not exit within {timeout} s:\n{gw.stderr()[-2000:]}") from None


def test_sigterm_lets_running_streams_finish_within_the_grace(tmp_path):
    with start_stub("vllm", "--model", "m", log_path=tmp_path / "s.log") as stub:
        cfg = _reload_cfg(stub.base, 4)
        cfg["shutdown_grace_s"] = 20
        with Gateway(cfg) as gw, ThreadPoolExecutor(2) as pool:
            streams = [pool.submit(chat, gw, "[stub content=60 delay_ms=20]", model="m") for _ in range(2)]
            wait_for(lambda: stub.stats()["in_flight"] == 2, 5)
            gw.signal(signal.SIGTERM)
            wait_for(lambda: "shutting down: 2 requests in flight" in gw.stderr(), 5)
            wait_for(lambda: _refused(gw), 2)  # no longer accepting connections
            for f in streams:
                status, _, raw = f.result()
                assert status == 200 and done_ok(raw) and content_tokens(raw) == 60
            assert _exit_code(gw, 10) == 0
            assert "cancelled" not in stub.log_text()
            assert [r["outcome"] for r in gw.access_log()] == ["ok", "ok"]


def test_sigterm_past_the_grace_cancels_upstreams_and_exits_0(tmp_path):
    with start_stub("vllm", "--model", "m", log_path=tmp_path / "s.log") as stub:
        cfg = _reload_cfg(stub.base, 2)
        cfg["shutdown_grace_s"] = 0.5
        with Gateway(cfg) as gw, ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(chat, gw, "[stub content=400 delay_ms=20]", model="m") for _ in range(2)]
            wait_for(lambda: stub.stats()["in_flight"] == 2, 5)
            waiting = pool.submit(chat, gw, "[stub content=2]", model="m", stream=False)
            wait_for(lambda: gw.admin()["backends"]["b"]["queued"] == 1, 5)
            gw.signal(signal.SIGTERM)
            assert _exit_code(gw, 10) == 0
            for f in streams:
                status, _, raw = f.result()
                assert status == 200 and not done_ok(raw)
                assert b"shutting down" in raw  # an error frame, not a silent truncation
            status, headers, raw = waiting.result()
            # OpenAI's dialect has no 529: its overload status is 429, which its SDKs retry
            assert status == 429 and headers.get("retry-after") and b"shutting down" in raw
            wait_for(lambda: stub.log_text().count("cancelled") == 2, 2)
            wait_for(lambda: stub.stats()["in_flight"] == 0, 2)  # nothing orphaned upstream
            assert stub.stats()["completed"] == 0
            outcomes = sorted(r["outcome"] for r in gw.access_log())
            assert outcomes == ["error_overloaded", "error_overloaded", "rejected_overloaded"]
            assert "shutdown complete" in gw.stderr()
