"""Latest wins across replicas (admission/redis_supersede.py): two real gateway processes sharing
a real redis-server, in front of one stub. An editor's completions land on either replica; the
newer one cancels the older wherever it runs, and the stub's own log and counters say whether a
generation was cut or never arrived (not the gateway's word)."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from gwproc import Gateway, config_for
from redisproc import RedisServer, available
from stubproc import start_stub, wait_for

pytestmark = pytest.mark.skipif(not available(), reason="needs redis-server (.ci/deps/redis.sh)")

ALICE, BOB, CAROL, ADMIN = "sk-alice", "sk-bob", "sk-carol", "sk-admin"


@pytest.fixture(scope="module")
def stub(tmpdir_session):
    with start_stub("vllm", "--model", "coder-7b",
                    log_path=os.path.join(tmpdir_session, "stub-supersede-cluster.log")) as s:
        yield s


@pytest.fixture(scope="module")
def replicas(stub):
    """Gateways a and b on one Redis: `coder` and `coder2` are latest-wins models on a 4-slot
    backend; `coder1` (latest wins) and `raw1` share a one-slot backend, for a queue."""
    with RedisServer() as r, ExitStack() as stack:
        # a Redis the cluster has used before: no fresh-epoch grace before the first slot
        r.client().set("hlf:epoch", 0)
        models = {name: {"backend": backend, "upstream_model": "coder-7b", "supersede": supersede}
                  for name, backend, supersede in (("coder", "gpu", True), ("coder2", "gpu", True),
                                                   ("coder1", "one", True), ("raw1", "one", False))}

        def start(replica: str) -> Gateway:
            cfg = config_for(
                {"gpu": {"url": stub.base, "kind": "vllm", "slots": 4},
                 "one": {"url": stub.base, "kind": "vllm", "slots": 1, "queue": {"depth": 8, "timeout_s": 30}}},
                models,
                auth={"keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB},
                               {"name": "carol", "key": CAROL}],
                      "admin_key_env": "HLF_TEST_ADMIN_KEY"},
                cluster={"redis_url": r.url, "lease_s": 5, "replica_id": f"gw-{replica}"})
            return Gateway(cfg, env={"HLF_TEST_ADMIN_KEY": ADMIN})

        with ThreadPoolExecutor(2) as pool:  # each takes a second to start
            futs = [pool.submit(start, name) for name in ("a", "b")]
        gws = [stack.enter_context(f.result()) for f in futs if f.exception() is None]
        for f in futs:
            f.result()  # a replica that failed to start fails the module (the other is stopped)
        yield (*gws, r)


@pytest.fixture
def ab(replicas, stub):
    stub.reset()
    return replicas[:2]


@pytest.fixture
def log(stub):
    """word -> the stub's log lines starting with it, written during this test."""
    start = len(stub.log_lines())
    return lambda word: [ln for ln in stub.log_lines()[start:] if ln.startswith(word)]


def _stream(gw: Gateway, key: str, body: dict, out: list) -> threading.Thread:
    """A streamed completion on a thread: `out` gets (status, body text)."""
    def run():
        req = urllib.request.Request(gw.base + "/completions", method="POST",
                                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
                                     data=json.dumps({**body, "stream": True}).encode())
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                out.append((resp.status, resp.read().decode()))
        except urllib.error.HTTPError as err:
            out.append((err.code, err.read().decode()))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _complete(gw: Gateway, key: str, model: str, prompt: str, n: int) -> tuple[int, str]:
    out: list = []
    _stream(gw, key, {"model": model, "prompt": prompt, "max_tokens": n}, out).join(60)
    assert out, "no answer within 60 s"
    return out[0]


def _text(raw: str) -> str:
    docs = [json.loads(f[len("data: "):]) for f in raw.split("\n\n")
            if f.startswith("data: ") and f != "data: [DONE]"]
    return "".join(c["text"] for d in docs for c in d.get("choices", []))


def _queued(gw: Gateway) -> int:
    doc = gw.admin({"Authorization": f"Bearer {ADMIN}"})
    return sum(r["phase"] == "queued" for r in doc["requests"])


def test_a_newer_completion_on_b_cuts_the_generation_a_runs(ab, stub, log):
    a, b = ab
    old: list = []
    th = _stream(a, ALICE, {"model": "coder", "prompt": "old [stub delay_ms=50]", "max_tokens": 200}, old)
    wait_for(lambda: log("request") and stub.stats()["in_flight"] == 1, timeout=20)
    status, raw = _complete(b, ALICE, "coder", "new", 3)
    assert status == 200 and _text(raw) == " c1 c2 c3" and "data: [DONE]" in raw
    th.join(30)
    status, raw = old[0]
    assert status == 200 and "superseded" in raw and "[DONE]" not in raw
    # the stub's own evidence: exactly one generation cut, well short of its 200 tokens, and
    # nothing left running on the backend
    cut = wait_for(lambda: log("cancelled"), timeout=10)
    assert len(cut) == 1 and int(cut[0].split("after ")[1].split()[0]) < 200
    assert any("tokens=3" in ln for ln in log("completed"))
    wait_for(lambda: stub.stats()["in_flight"] == 0, timeout=10)
    assert stub.stats()["cancelled"] == 1
    rec = wait_for(lambda: [r for r in a.access_log() if r.get("outcome") == "cancelled_superseded"], timeout=10)
    assert rec[-1]["model"] == "coder"
    assert not [r for r in b.access_log() if r.get("outcome") == "cancelled_superseded"]


def test_a_queued_completion_on_a_leaves_the_queue_before_it_reaches_the_backend(ab, stub, log):
    a, b = ab
    # bob's long turn holds the one-slot backend; alice's first completion queues on a
    busy: list = []
    bob = _stream(b, BOB, {"model": "raw1", "prompt": "busy [stub delay_ms=20]", "max_tokens": 60}, busy)
    wait_for(lambda: stub.stats()["in_flight"] == 1, timeout=20)
    stale: list = []
    th = _stream(a, ALICE, {"model": "coder1", "prompt": "stale", "max_tokens": 3}, stale)
    wait_for(lambda: _queued(a) == 1, timeout=10)
    status, raw = _complete(b, ALICE, "coder1", "fresh", 3)
    th.join(30)
    bob.join(30)
    assert status == 200 and _text(raw) == " c1 c2 c3"
    status, raw = stale[0]
    assert status == 400 and "superseded" in raw
    prompts = [r["body"].get("prompt") for r in stub.requests()]
    assert "stale" not in prompts and "fresh" in prompts  # the stale one never reached the backend
    assert busy[0][0] == 200 and "[DONE]" in busy[0][1] and stub.stats()["cancelled"] == 0


def test_another_client_or_another_model_is_not_superseded(ab, stub, log):
    a, b = ab
    # two long generations on a: alice's, and carol's, which later serves as a barrier
    alice: list = []
    carol: list = []
    ta = _stream(a, ALICE, {"model": "coder", "prompt": "alice [stub delay_ms=20]", "max_tokens": 500}, alice)
    tc = _stream(a, CAROL, {"model": "coder", "prompt": "carol [stub delay_ms=20]", "max_tokens": 500}, carol)
    wait_for(lambda: stub.stats()["in_flight"] == 2, timeout=20)
    assert _complete(b, BOB, "coder", "bob", 3)[0] == 200  # another client, same model
    assert _complete(b, ALICE, "coder2", "other model", 3)[0] == 200  # same client, another model
    # carol's newer completion cuts her own on a. Replica a hears the registrations in the order
    # Redis ran them, so by the time carol's is cut, bob's and alice's other-model ones were heard
    # (no waiting on a clock for a cancellation that should not come)
    assert _complete(b, CAROL, "coder", "carol again", 3)[0] == 200
    tc.join(30)
    assert carol and "superseded" in carol[0][1]
    # the stub logs a cut when its next token finds the client gone: evidence to wait for
    wait_for(lambda: len(log("cancelled")) == 1 and stub.stats()["in_flight"] == 1, timeout=30)
    assert ta.is_alive()
    # and alice's own newer completion on the same model still ends hers
    assert _complete(b, ALICE, "coder", "alice again", 3)[0] == 200
    ta.join(30)
    assert alice and "superseded" in alice[0][1]
    cut = wait_for(lambda: len(log("cancelled")) == 2 and log("cancelled"), timeout=30)
    assert all(int(ln.split("after ")[1].split()[0]) < 500 for ln in cut)
    assert [ln.split()[2] for ln in log("completed")] == ["tokens=3"] * 4


def test_without_redis_a_completion_meets_the_slot_rule_never_a_500_and_it_is_said_once(replicas, stub):
    # last in the module: it stops the Redis the replicas share. A completion's registration
    # fails with it; the completion goes on (latest wins on this replica only) to its slot,
    # which the shared pool cannot take without Redis: the overload error with Retry-After.
    a, _, r = replicas
    stub.reset()
    r.stop()
    try:
        for prompt in ("first", "second"):
            status, raw = _complete(a, ALICE, "coder", prompt, 3)
            assert status == 429 and "overloaded" in raw, (status, raw)
        said = [ln for ln in a.stderr().splitlines() if "supersede: cannot register" in ln]
        assert len(said) == 1, said
        assert stub.stats()["total"] == 0
    finally:
        r.start()  # the replicas close against a Redis that answers
