"""Several boxes, one door (docs/several-boxes.md): three real gateways on 127.0.0.1, a front and
two boxes, each box with its own stubs. The front's config names the boxes (one of them without a
kind: detected) and no models at all; everything else it learns from the boxes.

Judged by each box's own evidence: its stub's log and counters (what ran, how many at once, what
was cancelled), its admin view (what waited there), its access log and ledger (whom it counted)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from conftest import R1
from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw, sse_events
from stubproc import start_stub, wait_for

FRONT_KEY = "sk-front-on-box"  # the front's key on each box (marked peer there)
ALICE = "sk-alice"
BOB = "sk-bob"
ENV = {"HLF_PEER_KEY": FRONT_KEY, "HLF_TEST_ADMIN_KEY": "sk-admin"}
ADMIN = {"Authorization": "Bearer sk-admin"}


def box_config(stub_base: str, models: dict, slots: int = 2) -> dict:
    return config_for(
        {"gpu0": {"url": stub_base, "kind": "vllm", "slots": slots, "health_interval_s": 0.5}},
        models,
        auth={"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True},
                       {"name": "alice", "key": ALICE}],
              "admin_key_env": "HLF_TEST_ADMIN_KEY"},
    )


def front_config(box1: str, box2: str | None = None, **extra) -> dict:
    backends = {"box1": {"url": box1, "kind": "peer", "api_key_env": "HLF_PEER_KEY", "health_interval_s": 1.0}}
    if box2 is not None:  # no kind: detected from its models list
        backends["box2"] = {"url": box2, "api_key_env": "HLF_PEER_KEY", "health_interval_s": 1.0}
    cfg = {"backends": backends,
           "auth": {"keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}],
                    "admin_key_env": "HLF_TEST_ADMIN_KEY"}}
    cfg.update(extra)
    return cfg


@pytest.fixture(scope="module")
def stub1(tmpdir_session):
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "4096",
                    log_path=os.path.join(tmpdir_session, "stub-peer1.log")) as s:
        yield s


@pytest.fixture(scope="module")
def stub2(tmpdir_session):
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "8192",
                    log_path=os.path.join(tmpdir_session, "stub-peer2.log")) as s:
        yield s


R1_MODEL = {"backend": "gpu0", "upstream_model": R1, "capabilities": ["completion", "tools", "thinking"]}


@pytest.fixture(scope="module")
def box1(stub1):
    with Gateway(box_config(stub1.base, {"r1": R1_MODEL}), env=ENV) as g:
        yield g


@pytest.fixture(scope="module")
def front(box1):
    with Gateway(front_config(box1.base), env=ENV) as g:
        wait_for(lambda: "r1" in models(g), 15, 0.05)
        yield g


def models(gw, key: str = ALICE) -> dict[str, dict]:
    status, doc = gw.get("/llm/v1/models", {"Authorization": f"Bearer {key}"})
    assert status == 200, doc
    return {m["id"]: m for m in doc["data"]}


def chat(gw, model: str, prompt: str = "hi", key: str = ALICE, stream: bool = False, **extra):
    return post_raw(gw.base + "/chat/completions",
                    {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}], **extra},
                    headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_the_front_serves_the_peers_models_under_their_own_names(front, box1, stub1):
    listed = models(front)
    r1 = listed["r1"]
    assert r1["context_length"] == 4096 and r1["capabilities"] == ["completion", "tools", "thinking"]
    assert r1["state"] == "loaded"
    assert [b["name"] for b in r1["homelab"]["backends"]] == ["box1/gpu0"]
    assert r1["homelab"]["slots"] == 2  # the box's own slots, not typed again at the front
    stub1.reset()
    status, _, raw = chat(front, "r1")
    assert status == 200
    doc = json.loads(raw)
    assert doc["model"] == "r1" and doc["choices"][0]["message"]["content"]
    sent = stub1.requests()[-1]
    assert sent["body"]["model"] == R1
    # what reached the box's backend carries nothing of the front's peer headers or keys
    assert "x-hlf-on-behalf-of" not in sent["headers"] and "authorization" not in sent["headers"]


def test_both_ledgers_count_the_person(front, box1):
    status, _, _ = chat(front, "r1", prompt="ledger", key=BOB)
    assert status == 200
    wait_for(lambda: any(e.get("key") == "bob" and e.get("model") == "r1" for e in box1.access_log()), 10)
    wait_for(lambda: any(e.get("key") == "bob" and e.get("model") == "r1" for e in front.access_log()), 10)
    on_box = [e for e in box1.access_log() if e.get("key") == "bob"]
    on_front = [e for e in front.access_log() if e.get("key") == "bob"]
    assert len(on_box) == len(on_front) == 1  # once on each box: never under the front's key
    assert not any(e.get("key") == "front" and e.get("model") == "r1" for e in box1.access_log())

    def ledger(gw):
        status, doc = gw.get("/admin/usage?key=bob", ADMIN)
        assert status == 200, doc
        return sum(r["requests"] for r in doc["rows"]), sum(r["output_tokens"] for r in doc["rows"])
    wait_for(lambda: ledger(box1)[0] == 1 and ledger(front)[0] == 1, 10, 0.05)  # the ledgers: bob, once each
    assert ledger(box1)[1] == ledger(front)[1] > 0  # the same tokens on both
    status, doc = box1.get("/admin/usage?key=front", ADMIN)
    assert status == 200 and not doc["rows"]  # the front's key never counted for a person's request


def test_the_person_header_is_believed_only_from_a_peer_key(box1, stub1):
    status, _, _ = post_raw(box1.base + "/chat/completions",
                            {"model": "r1", "messages": [{"role": "user", "content": "spoof"}]},
                            headers={"Authorization": f"Bearer {ALICE}", "x-hlf-on-behalf-of": "mallory"})
    assert status == 200
    wait_for(lambda: any(e.get("path", "").endswith("/chat/completions") and e.get("key") == "alice"
                         for e in box1.access_log()), 10)
    assert not any(e.get("key") == "mallory" for e in box1.access_log())


def test_a_model_added_or_removed_on_the_box_comes_and_goes_at_the_front(front, box1, stub1):
    box1.write_config(box_config(stub1.base, {"r1": R1_MODEL, "r1-copy": {"backend": "gpu0", "upstream_model": R1}}))
    box1.signal(signal.SIGHUP)
    wait_for(lambda: "r1-copy" in models(front), 15, 0.05)
    assert chat(front, "r1-copy")[0] == 200
    box1.write_config(box_config(stub1.base, {"r1": R1_MODEL}))
    box1.signal(signal.SIGHUP)
    wait_for(lambda: "r1-copy" not in models(front), 15, 0.05)
    status, _, raw = chat(front, "r1-copy")
    assert status == 404 and "r1-copy" in raw.decode()


def test_the_boxes_backends_show_in_the_fronts_admin_metrics_and_ollama_lists(front):
    status, doc = front.get("/admin/backends", ADMIN)
    assert status == 200
    view = {b["name"]: b for b in doc["backends"]}
    assert view["box1/gpu0"]["slots"] == 2 and view["box1"]["kind"] == "peer"
    assert view["box1/gpu0"]["box"] == "box1" and "box" not in view["box1"]
    box = doc["boxes"]["box1"]  # the box itself: reachable, polled lately, its models and backends
    assert box["reachable"] is True and box["models"] == {"r1": "loaded"} and box["backends"] == ["box1/gpu0"]
    assert 0 <= box["last_poll_s_ago"] < 5 and box["last_answer_s_ago"] == box["last_poll_s_ago"]
    status, snap = front.get("/admin/requests", ADMIN)  # what the dashboard polls says the same
    assert status == 200 and snap["boxes"]["box1"]["models"] == {"r1": "loaded"}
    assert snap["backends"]["box1/gpu0"]["box"] == "box1"
    status, text = front.get("/metrics", ADMIN)
    assert status == 200 and 'backend="box1/gpu0"' in text
    status, tags = front.get("/api/tags", {"Authorization": f"Bearer {ALICE}"})
    r1 = {m["name"]: m for m in tags["models"]}["r1:latest"]
    assert r1["capabilities"] == ["completion", "tools", "thinking"] and r1["state"] == "loaded"
    status, show = front.post("/api/show", {"model": "r1"}, {"Authorization": f"Bearer {ALICE}"})
    assert status == 200 and "thinking" in show["capabilities"] and show["model_info"]["unknown.context_length"] == 4096
    status, ps = front.get("/api/ps", {"Authorization": f"Bearer {ALICE}"})
    assert [m["name"] for m in ps["models"]] == ["r1:latest"]  # loaded on a box
