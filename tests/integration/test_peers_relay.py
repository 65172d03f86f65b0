"""A box cut off by a relay (docs/several-boxes.md, "When a box fails"): a front reaches box1
through a TCP relay the test controls (tests/support/cut_relay.py) and box2 directly; both serve
`r1`, box1 alone `only1`. The relay is cut (connections reset, new ones refused) or black-holed
(accepted, silent both ways), before the first byte and mid-stream:

- before the first byte, the request fails over to box2 (cut: the reset; black hole: the box's
  unanswered poll, within its timeout, not the request's whole first_token_s);
- mid-stream, the client's stream ends with the dialect's error (cut: at once; black hole: at the
  front's idle_s);
- the front marks box1 down: its backend here down, `only1` shown `down`, the box unreachable;
- when the relay comes back, box1 and its models do too, and serve again.

Every wait is bounded (wait_for's timeouts, the clients' socket timeouts, threads joined with a
timeout and checked), so a front that hangs fails the test instead of hanging it."""

from __future__ import annotations

import threading

import pytest

from conftest import R1
from homelab_frontend.policy import affinity
from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub, wait_for
from support.cut_relay import CutRelay

KEY = "sk-front-relay"
ENV = {"HLF_PEER_KEY": KEY, "HLF_TEST_ADMIN_KEY": "sk-admin-relay"}
ADMIN = {"Authorization": "Bearer sk-admin-relay"}


def box_config(stub_base: str, slots: int, models: dict) -> dict:
    return config_for({"gpu0": {"url": stub_base, "kind": "vllm", "slots": slots, "health_interval_s": 0.5}},
                      models, auth={"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}],
                                    "admin_key_env": "HLF_TEST_ADMIN_KEY"})


R1_MODEL = {"backend": "gpu0", "upstream_model": R1}


@pytest.fixture
def homelab(tmp_path):
    """(front, relay, stub1, stub2): box1 (4 slots: preferred while up) behind the relay."""
    with start_stub("vllm", "--model", R1, log_path=tmp_path / "s1.log") as s1, \
            start_stub("vllm", "--model", R1, log_path=tmp_path / "s2.log") as s2, \
            Gateway(box_config(s1.base, 4, {"r1": R1_MODEL, "only1": R1_MODEL}), env=ENV) as b1, \
            Gateway(box_config(s2.base, 2, {"r1": R1_MODEL}), env=ENV) as b2, \
            CutRelay(int(b1.url.rsplit(":", 1)[1])) as relay:
        peer = {"kind": "peer", "api_key_env": "HLF_PEER_KEY", "health_interval_s": 1.0}
        cfg = {"backends": {
            "box1": {**peer, "url": relay.url + "/llm/v1",
                     "timeouts": {"connect_s": 1, "idle_s": 3, "first_token_s": 120}},
            "box2": {**peer, "url": b2.base}},
            "auth": {"admin_key_env": "HLF_TEST_ADMIN_KEY"}}
        with Gateway(cfg, env=ENV) as front:
            wait_for(lambda: _up(front, "box1/gpu0") and _up(front, "box2/gpu0"), 15, 0.05)
            wait_for(lambda: _models(front).get("only1", {}).get("state") == "loaded", 15, 0.05)
            yield front, relay, s1, s2


def _backends(gw) -> dict[str, dict]:
    status, doc = gw.get("/admin/backends", ADMIN)
    assert status == 200, doc
    return {b["name"]: b for b in doc["backends"]}


def _up(gw, name: str) -> bool:
    return _backends(gw).get(name, {}).get("up") is True


def _models(gw) -> dict[str, dict]:
    status, doc = gw.get("/llm/v1/models")
    assert status == 200, doc
    return {m["id"]: m for m in doc["data"]}


# Session affinity ranks the boxes by a hash of the conversation (policy/affinity.py): every
# request carries a session whose first choice is box1, so box1 is where each one goes while up
SESSION = next(f"relay-{i}" for i in range(1000)
               if affinity.rank(f"h:relay-{i}", ["box1/gpu0", "box2/gpu0"])[0] == "box1/gpu0")


def _chat(gw, prompt: str, model: str = "r1", stream: bool = True):
    return post_raw(gw.base + "/chat/completions",
                    {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}]},
                    headers={"session-id": SESSION},
                    timeout=30)  # each read: a front that hangs fails here, it does not hang the suite


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as err:  # noqa: BLE001 -- the test reads it
            out["error"] = err
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _joined(t: threading.Thread, out: dict, timeout: float = 45) -> tuple[int, dict, bytes]:
    t.join(timeout)
    assert not t.is_alive(), "the client is still waiting: the front hangs"
    assert "error" not in out, out.get("error")
    return out["result"]


def _streaming_on(front, stub) -> None:
    wait_for(lambda: stub.stats()["in_flight"] == 1, 10, 0.02)
    wait_for(lambda: any(r.get("phase") == "streaming" for r in front.get("/admin/requests", ADMIN)[1]["requests"]),
             10, 0.02)


def _last_chat(front) -> dict:
    return [e for e in front.access_log() if e.get("path", "").endswith("/chat/completions")][-1]


def _box1_down_and_its_model_gone(front) -> None:
    wait_for(lambda: not _up(front, "box1/gpu0"), 15, 0.05)
    models = _models(front)
    assert models["only1"]["state"] == "down"  # box1's alone: shown down, not loaded
    r1 = models["r1"]
    assert r1["state"] == "loaded"  # box2 still has it
    assert {b["name"]: b["state"] for b in r1["homelab"]["backends"]} == {"box1/gpu0": "down", "box2/gpu0": "loaded"}
    status, doc = front.get("/admin/backends", ADMIN)
    assert doc["boxes"]["box1"]["reachable"] is False and doc["boxes"]["box1"]["models"] == {}
    assert doc["boxes"]["box2"]["reachable"] is True


def _no_slot_held(front) -> None:
    wait_for(lambda: all(b["in_use"] == 0 and b["queued"] == 0 for b in _backends(front).values()), 10, 0.05)


def _recovers(front, relay, s1) -> None:
    relay.restore()
    wait_for(lambda: _up(front, "box1/gpu0"), 15, 0.05)
    wait_for(lambda: _models(front)["only1"]["state"] == "loaded", 15, 0.05)
    s1.reset()
    status, _, raw = _chat(front, "back again", model="only1", stream=False)
    assert status == 200, raw
    assert len(s1.requests()) == 1 and _last_chat(front)["backend"] == "box1/gpu0"


def test_a_cut_relay_fails_over_before_the_first_byte_ends_a_stream_and_recovers(homelab):
    front, relay, s1, s2 = homelab
    # before the first byte: box1's server holds the headers back, the relay is cut meanwhile
    t, out = _in_thread(lambda: _chat(front, "[stub headers_ms=3000] cut early"))
    wait_for(lambda: s1.stats()["in_flight"] == 1, 10, 0.02)
    relay.cut()
    status, _, raw = _joined(t, out)
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw  # box2 answered it whole
    entry = _last_chat(front)
    assert entry["backends_tried"] == ["box1/gpu0", "box2/gpu0"] and entry["backend"] == "box2/gpu0"
    assert [f["cause"] for f in entry["failovers"]] in (["reset"], ["unreachable"]), entry
    wait_for(lambda: s1.stats()["in_flight"] == 0, 10, 0.02)  # box1's gateway stopped its server's work
    _box1_down_and_its_model_gone(front)
    status, _, raw = _chat(front, "only box1 has it", model="only1", stream=False)
    assert status == 503 and b"box1" in raw, raw  # a clear 503 naming the box
    _recovers(front, relay, s1)

    # mid-stream: the relay is cut under a stream from box1
    t, out = _in_thread(lambda: _chat(front, "[stub content=300 delay_ms=20] cut mid-stream"))
    _streaming_on(front, s1)
    relay.cut()
    status, _, raw = _joined(t, out)
    assert status == 200 and b"[DONE]" not in raw and b'"error"' in raw, raw  # the dialect's error, no clean end
    wait_for(lambda: s1.stats()["in_flight"] == 0, 10, 0.02)  # the generation stopped at the box's server
    _box1_down_and_its_model_gone(front)
    _recovers(front, relay, s1)
    _no_slot_held(front)


def test_a_black_holed_relay_fails_over_at_the_poll_ends_a_stream_at_idle_and_recovers(homelab):
    front, relay, s1, s2 = homelab
    # before the first byte: the box's answer is swallowed; the front's poll of box1 goes
    # unanswered (1 s timeout), box1 is marked down, and the request waiting there fails over
    t, out = _in_thread(lambda: _chat(front, "[stub headers_ms=3000] black hole early"))
    wait_for(lambda: s1.stats()["in_flight"] == 1, 10, 0.02)
    relay.blackhole()
    status, _, raw = _joined(t, out)
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw
    entry = _last_chat(front)
    assert entry["backends_tried"] == ["box1/gpu0", "box2/gpu0"] and entry["backend"] == "box2/gpu0"
    assert [f["cause"] for f in entry["failovers"]] == ["box_down"], entry
    assert entry["ttft_ms"] < 60_000  # its poll's timeout, nowhere near its first_token_s (120 s)
    _box1_down_and_its_model_gone(front)
    assert "did not answer /models within 1 s" in (_backends(front)["box1"].get("last_error") or
                                                    front.admin(ADMIN)["backends"]["box1"]["last_error"])
    _recovers(front, relay, s1)

    # mid-stream: the stream from box1 goes silent; the front's idle_s (3 s) ends it
    t, out = _in_thread(lambda: _chat(front, "[stub content=400 delay_ms=20] black hole mid-stream"))
    _streaming_on(front, s1)
    relay.blackhole()
    status, _, raw = _joined(t, out)
    assert status == 200 and b"[DONE]" not in raw and b'"error"' in raw, raw
    assert b"silent" in raw  # the idle timeout's message
    _box1_down_and_its_model_gone(front)
    _recovers(front, relay, s1)  # restoring drops the black-holed connections: the box's server stops
    wait_for(lambda: s1.stats()["in_flight"] == 0, 10, 0.02)
    _no_slot_held(front)
