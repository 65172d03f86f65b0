"""parts.py, the core both Gemini encoders share: which parts each event completes, what is held
and when it goes out, where the signatures go. (test_stream.py checks the same rules through the
encoders, with the SDK as the oracle.)"""

from __future__ import annotations

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.gemini.parts import CALL, TEXT, THOUGHT, PartMachine, part_json
from homelab_frontend.surfaces.gemini.rules import reasoning_from
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"parts")


def machine(show: bool = True) -> PartMachine:
    return PartMachine(signer=SIGNER, include_thoughts=show, new_call_id=iter(f"gen{i}" for i in range(9)).__next__)


def test_reasoning_is_held_until_a_part_carries_it():
    pm = machine()
    assert pm.feed(c.ReasoningDelta("a")) == [(THOUGHT, "a", None)]
    assert pm.reasoning == ["a"]
    [(kind, text, sig)] = pm.feed(c.TextDelta("x"))
    assert (kind, text) == (TEXT, "x") and reasoning_from(SIGNER, sig) == "a"
    assert not pm.reasoning and pm.feed(c.TextDelta("y")) == [(TEXT, "y", None)]
    assert machine(show=False).feed(c.ReasoningDelta("hidden")) == []


def test_a_call_is_held_until_it_is_complete():
    # (whitespace vLLM streams between a call's arguments is the chunk decoder's to hold:
    # tests/unit/upstream/test_decode.py)
    pm = machine()
    assert pm.feed(c.ToolCallStart(0, "", "f")) == []
    assert pm.feed(c.ToolArgsDelta(0, '{"a"')) == [] and pm.calls
    assert pm.feed(c.ToolArgsDelta(0, ": 1}")) == []
    out = pm.feed(c.ToolCallStart(1, "", "g"))  # the next call completes the first
    assert [part_json(p) for p in out] == [{"functionCall": {"id": "gen0", "name": "f", "args": {"a": 1}}}]
    out = pm.feed(c.TextDelta("done"))
    assert [p[0] for p in out] == [CALL, TEXT] and out[1][1] == "done"
    assert pm.end() == []


def test_the_end_sends_what_is_held():
    pm = machine()
    pm.feed(c.ReasoningDelta("r"))
    pm.feed(c.ToolCallStart(0, "id1", "f"))
    [(kind, call, sig)] = pm.end()
    assert kind is CALL and call.id == "id1" and reasoning_from(SIGNER, sig) == "r"
    pm = machine()
    pm.feed(c.ReasoningDelta("only"))
    [(kind, text, sig)] = pm.end()
    assert (kind, text) == (TEXT, "") and reasoning_from(SIGNER, sig) == "only"


def test_usage_finish_and_errors_are_remembered_not_parts():
    pm = machine()
    assert pm.feed(c.Usage(5, None)) == [] and pm.feed(c.Usage(None, 3)) == []
    assert pm.usage == c.Usage(5, 3)
    pm.feed(c.Finish("length"))
    pm.feed(c.Finish("stop"))
    assert pm.finish == c.Finish("length")  # the first wins
    pm.feed(c.UpstreamError("x"))
    assert pm.error == c.UpstreamError("x")
    assert pm.feed(c.ToolArgsDelta(3, "{}")) == [] and pm.dropped_tool_args == 1
