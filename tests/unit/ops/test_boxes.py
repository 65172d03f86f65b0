"""The boxes view (ops/boxes.py): a front's peers with their state, models and backends here."""

from __future__ import annotations

from types import SimpleNamespace as NS

from homelab_frontend.ops.boxes import box_of, boxes_view
from homelab_frontend.policy.routing import PeerLink


def _b(kind: str, up: bool = True, peer: PeerLink | None = None, error: str | None = None):
    return NS(cfg=NS(kind=kind), up=up, peer=peer, last_error=error)


def test_a_box_groups_its_backends_with_its_state_and_models():
    link = PeerLink("box1", polled_at=95.0, answered_at=95.0,
                    models={"r1": NS(state="loaded"), "coder": NS(state="stopped")})
    backends = {"box1": _b("peer", peer=link), "box1/gpu0": _b("peer", peer=PeerLink("box1", "gpu0")),
                "box1/gpu1": _b("peer", peer=PeerLink("box1", "gpu1")), "local": _b("vllm")}
    view = boxes_view(backends, now=100.0)
    assert view == {"box1": {"reachable": True, "last_poll_s_ago": 5.0, "last_answer_s_ago": 5.0, "last_error": None,
                             "models": {"coder": "stopped", "r1": "loaded"}, "backends": ["box1/gpu0", "box1/gpu1"]}}
    assert box_of(backends["box1/gpu0"]) == "box1" and box_of(backends["box1"]) is None
    assert box_of(backends["local"]) is None


def test_an_unreachable_box_lists_no_models_and_says_when_it_last_answered():
    link = PeerLink("box2", polled_at=99.0, answered_at=80.0, models={"r1": NS(state="loaded")})
    view = boxes_view({"box2": _b("peer", up=False, peer=link, error="backend 'box2' is unreachable")}, now=100.0)
    assert view["box2"]["reachable"] is False and view["box2"]["models"] == {}
    assert view["box2"]["last_poll_s_ago"] == 1.0 and view["box2"]["last_answer_s_ago"] == 20.0
    assert view["box2"]["last_error"] == "backend 'box2' is unreachable"


def test_a_box_never_polled_says_so():
    view = boxes_view({"box3": _b("peer", peer=PeerLink("box3"))}, now=1.0)
    assert view["box3"]["last_poll_s_ago"] is None and view["box3"]["last_answer_s_ago"] is None
