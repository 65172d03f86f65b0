"""One request, one queue, across boxes (docs/several-boxes.md): three real gateways (a front,
two or three boxes, each with its own stubs and, for one, a managed stub of its own `resources`).

- a box's server never runs more than its slots, and nothing waits at a box: the waiting is the
  front's (its queue, its timeout, its Retry-After);
- loaded first: a box where the model is stopped is not started while a loaded one has a slot;
  it is when waiting would take longer, and its loading stops the front's first-token clock;
- a box killed with SIGKILL: before the first byte, a failover to the other box; mid-stream, the
  client's stream ends in an error; with no box left, a 503 naming it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from conftest import R1
from gwproc import Gateway, config_for
from managed import stub_backend
from rawhttp import post_raw, sse_events
from stubproc import start_stub, wait_for

KEY = "sk-front"
ENV = {"HLF_PEER_KEY": KEY, "HLF_TEST_ADMIN_KEY": "sk-admin"}
ADMIN = {"Authorization": "Bearer sk-admin"}
MODEL = {"backend": "gpu0", "upstream_model": R1}


def box_config(backend: dict, **extra) -> dict:
    return config_for({"gpu0": backend}, {"r1": MODEL},
                      auth={"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}],
                            "admin_key_env": "HLF_TEST_ADMIN_KEY"}, **extra)


def peer(url: str, **extra) -> dict:
    return {"url": url, "kind": "peer", "api_key_env": "HLF_PEER_KEY", "health_interval_s": 1.0, **extra}


def backends(gw) -> dict[str, dict]:
    status, doc = gw.get("/admin/backends", ADMIN)
    assert status == 200, doc
    return {b["name"]: b for b in doc["backends"]}


def chat(gw, prompt="hi", stream=False, timeout=60):
    return post_raw(gw.base + "/chat/completions",
                    {"model": "r1", "stream": stream, "messages": [{"role": "user", "content": prompt}]}, timeout=timeout)


def in_threads(n, fn):
    out: list = [None] * n

    def run(i):
        out[i] = fn()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


@pytest.fixture
def stubs(tmp_path):
    with start_stub("vllm", "--model", R1, log_path=tmp_path / "s1.log") as s1, \
            start_stub("vllm", "--model", R1, log_path=tmp_path / "s2.log") as s2:
        yield s1, s2


def test_one_queue_the_boxes_never_run_more_than_their_slots_and_nothing_waits_twice(stubs):
    s1, s2 = stubs
    with Gateway(box_config({"url": s1.base, "kind": "vllm", "slots": 2}), env=ENV) as b1, \
            Gateway(box_config({"url": s2.base, "kind": "vllm", "slots": 1}), env=ENV) as b2, \
            Gateway({"backends": {"box1": peer(b1.base), "box2": peer(b2.base, queue={"timeout_s": 30})},
                     "auth": {"admin_key_env": "HLF_TEST_ADMIN_KEY"}}, env=ENV) as front:
        wait_for(lambda: {"box1/gpu0", "box2/gpu0"} <= set(backends(front)), 15, 0.05)
        assert backends(front)["box1/gpu0"]["slots"] == 2 and backends(front)["box2/gpu0"]["slots"] == 1
        seen_queued_at_boxes = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                seen_queued_at_boxes.append(backends(b1)["gpu0"]["queued"] + backends(b2)["gpu0"]["queued"])
                time.sleep(0.02)
        watcher = threading.Thread(target=watch)
        watcher.start()
        threads, out = in_threads(6, lambda: chat(front, "[stub content=15 delay_ms=20] go", stream=True))
        # the three the boxes can run run; three wait, at the front
        wait_for(lambda: sum(b["queued"] for b in backends(front).values()) == 3, 15, 0.02)
        for t in threads:
            t.join(60)
        stop.set()
        watcher.join()
        assert all(r[0] == 200 for r in out)
        assert s1.stats()["max_in_flight"] == 2 and s2.stats()["max_in_flight"] == 1
        assert max(seen_queued_at_boxes) == 0  # no request ever waited at a box: one queue


def test_the_fronts_queue_timeout_and_retry_after_as_for_a_local_backend(stubs):
    s1, _ = stubs
    with Gateway(box_config({"url": s1.base, "kind": "vllm", "slots": 1}), env=ENV) as b1, \
            Gateway({"backends": {"box1": peer(b1.base, queue={"timeout_s": 0.5, "depth": 4})}}, env=ENV) as front:
        wait_for(lambda: "box1/gpu0" in backends(front), 15, 0.05)
        threads, out = in_threads(1, lambda: chat(front, "[stub content=200 delay_ms=20] long", stream=True))
        wait_for(lambda: s1.stats()["in_flight"] == 1, 10)
        before = len(s1.requests())
        t0 = time.monotonic()
        status, headers, raw = chat(front, "short")
        took = time.monotonic() - t0
        assert status in (429, 503) and "retry-after" in {k.lower() for k in headers}, raw
        assert 0.4 < took < 5, took
        assert len(s1.requests()) == before  # the box never saw it: it waited at the front only
        for t in threads:
            t.join(60)


def test_loaded_first_then_a_start_on_the_other_box_with_the_first_token_clock_paused(stubs, tmp_path):
    s1, _ = stubs
    cold = stub_backend("vllm", "--start-delay-s", "1.0", model=R1, uses=1.0, slots=2, start_timeout_s=30)
    with Gateway(box_config({"url": s1.base, "kind": "vllm", "slots": 1}), env=ENV) as b1, \
            Gateway(box_config(cold, resources={"gpu": 1}), env=ENV) as b3, \
            Gateway({"backends": {"box1": peer(b1.base),
                                  "box3": peer(b3.base, timeouts={"first_token_s": 1.0})}}, env=ENV) as front:
        wait_for(lambda: {"box1/gpu0", "box3/gpu0"} <= set(backends(front)), 15, 0.05)
        # box3 has started its server once (so it knows how long a start takes there) and stopped it
        assert b3.post("/admin/backends/gpu0/start", {}, ADMIN)[0] in (200, 202)
        wait_for(lambda: backends(b3)["gpu0"]["state"] == "ready", 30, 0.05)
        assert b3.post("/admin/backends/gpu0/stop", {}, ADMIN)[0] in (200, 202)
        wait_for(lambda: backends(b3)["gpu0"]["state"] == "stopped", 30, 0.05)

        def front_backends():
            return {b["name"]: b for b in front.get("/llm/v1/models")[1]["data"][0]["homelab"]["backends"]}
        wait_for(lambda: front_backends()["box3/gpu0"]["state"] == "stopped", 10, 0.05)
        eta = front_backends()["box3/gpu0"]["load_eta_s"]
        assert 0 < eta < 4, eta  # its last start, as box3 reports it
        status, doc = front.get("/llm/v1/models")
        states = {b["name"]: b["state"] for b in doc["data"][0]["homelab"]["backends"]}
        assert states == {"box1/gpu0": "loaded", "box3/gpu0": "stopped"}
        # a free slot where it is loaded: box1, and box3's server is never started
        assert chat(front)[0] == 200
        assert backends(b3)["gpu0"]["state"] == "stopped"
        # box1 busy for long; its expected wait (about 4 s: the front's estimate of a slot's hold)
        # is longer than box3's start (its last one): box3 starts it
        threads, out = in_threads(1, lambda: chat(front, "[stub content=300 delay_ms=20] long", stream=True))
        wait_for(lambda: s1.stats()["in_flight"] == 1, 10)
        t2, out2 = in_threads(1, lambda: chat(front, "[stub content=3] spill", stream=True))
        wait_for(lambda: front_backends()["box3/gpu0"]["state"] == "loading", 10, 0.02)
        t2[0].join(30)
        status, _, raw = out2[0]
        # a start of more than 1 s at box3 against a 1 s first-token timeout at the front: the clock stood still
        assert status == 200 and b"[DONE]" in raw, (raw[-300:], front.access_log()[-3:], b3.stderr()[-3000:])
        log = [e for e in front.access_log() if e.get("backend") == "box3/gpu0"]
        assert log and log[-1]["outcome"] == "ok"
        assert log[-1]["ttft_ms"] > 1000  # longer than the front's first-token timeout: it was paused
        assert backends(b3)["gpu0"]["state"] == "ready"
        for t in threads:
            t.join(60)


def test_a_box_killed_before_the_first_byte_fails_over_and_mid_stream_ends_the_stream(stubs):
    s1, s2 = stubs
    b1 = Gateway(box_config({"url": s1.base, "kind": "vllm", "slots": 2}), env=ENV)
    b2 = Gateway(box_config({"url": s2.base, "kind": "vllm", "slots": 4}), env=ENV)
    try:
        with Gateway({"backends": {"box1": peer(b1.base, health_interval_s=30),
                                   "box2": peer(b2.base, health_interval_s=30)}}, env=ENV) as front:
            wait_for(lambda: {"box1/gpu0", "box2/gpu0"} <= set(backends(front)), 15, 0.05)
            # mid-stream: box2 (more free slots) is streaming when it is killed
            chunks: list = []
            t, out = in_threads(1, lambda: chat(front, "[stub content=300 delay_ms=20] long", stream=True))
            wait_for(lambda: s2.stats()["in_flight"] == 1, 10)
            time.sleep(0.2)
            b2.proc.send_signal(signal.SIGKILL)
            t[0].join(30)
            status, _, raw = out[0]
            assert status == 200 and b"[DONE]" not in raw and b'"error"' in raw  # an error chunk, no clean end
            # before the first byte: box2 still looks up here (its next probe is 30 s away), so the
            # request goes there, finds it dead, and box1 answers
            s1.reset()
            status, _, raw = chat(front, "after")
            assert status == 200, raw
            assert len(s1.requests()) == 1
            entry = [e for e in front.access_log() if e.get("path", "").endswith("/chat/completions")][-1]
            assert entry["backend"] == "box1/gpu0"
            # no box left: a clear 503 naming it
            b1.proc.send_signal(signal.SIGKILL)
            status, _, raw = chat(front, "none left")
            assert status in (502, 503), raw
            assert b"box1" in raw
            # that failure had the front read box1 at once: it is down, and so is its backend here
            wait_for(lambda: not backends(front)["box1/gpu0"]["up"], 10, 0.05)
            status, headers, raw = chat(front, "none left again")
            assert status == 503 and b"box1/gpu0" in raw and b"backend 'box1'" in raw, raw
            assert "retry-after" in {k.lower() for k in headers}
    finally:
        b1.stop()
        b2.stop()
