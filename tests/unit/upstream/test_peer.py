"""A peer box's models list read (upstream/peer.py): untrusted, entry by entry."""

from __future__ import annotations

from hypothesis import given, strategies as st

from homelab_frontend.upstream import backend_kind
from homelab_frontend.upstream.peer import PeerBackend, is_peer_list, parse_models


def _entry(mid="r1", **home):
    return {"id": mid, "object": "model", "owned_by": "homelab-frontend", "context_length": 4096,
            "max_model_len": 4096, "capabilities": ["completion", "thinking"],
            "homelab": {"state": "loaded", "backends": [{"name": "gpu0", "state": "loaded", "slots": 2,
                                                           "in_use": 1, "queued": 0}], **home}}


def test_a_gateways_list_is_a_peer_and_not_vllm():
    doc = {"object": "list", "data": [_entry()]}
    assert is_peer_list(doc) and backend_kind.detect(doc) == "peer"
    vllm = {"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]}
    assert not is_peer_list(vllm) and backend_kind.detect(vllm) == "vllm"


def test_parse_reads_state_context_capabilities_and_backends():
    got = parse_models({"data": [_entry(), _entry("cold", state="stopped",
                                                   backends=[{"name": "gpu1", "state": "stopped", "slots": 4,
                                                              "load_eta_s": 12.5}])]})
    assert got["r1"].state == "loaded" and got["r1"].context_length == 4096
    assert got["r1"].capabilities == ("completion", "thinking")
    assert got["r1"].backends == (PeerBackend("gpu0", "loaded", 2, 1, 0, None),)
    assert got["cold"].backends[0].load_eta_s == 12.5 and got["cold"].state == "stopped"


def test_malformed_entries_are_dropped_one_by_one():
    bad_slots = _entry("x", backends=[{"name": "g", "state": "loaded", "slots": -1}])
    no_name = _entry("y", backends=[{"state": "loaded", "slots": 2}])
    odd_state = _entry("z", state="exploded", backends=[{"name": "g", "state": "weird", "slots": True}])
    got = parse_models({"data": [bad_slots, no_name, odd_state, "nonsense", {"id": 5}, _entry()]})
    assert list(got) == ["r1"]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=30))
def test_parse_never_raises(doc):
    parse_models(doc)
    parse_models({"data": [doc]})
    parse_models({"data": [{"id": "m", "homelab": doc}]})
