"""The flavours' shared pure parts (stub/flavour.py): a whole generation folded into message
parts for a non-streaming answer, and the deterministic embedding vector. (The flavours' wire
shapes over a loopback socket: test_flavours.py.)"""

from __future__ import annotations

import math

from homelab_frontend.stub.flavour import Aggregate, embedding_vector
from homelab_frontend.stub.timeline import Abort, Fail, Step, ToolDelta


def test_a_generation_folds_into_its_parts_and_counts():
    agg = Aggregate.of([
        Step(reasoning="Let me ", tokens=2), Step(reasoning="think.", tokens=1),
        Step(content="Hi", tokens=1), Abort(after_tokens=9), Fail(after_tokens=9),  # no tokens of their own
        Step(tool_calls=(ToolDelta(0, name="get_weather"),), tokens=1),
        Step(tool_calls=(ToolDelta(0, arguments='{"city":'),), tokens=1),
        Step(tool_calls=(ToolDelta(0, arguments='"Paris"}'),), finish="tool_calls", tokens=1),
    ])
    assert (agg.reasoning, agg.content, agg.saw_reasoning, agg.saw_content) == ("Let me think.", "Hi", True, True)
    assert (agg.tool_name, agg.tool_arguments) == ("get_weather", '{"city":"Paris"}')
    assert (agg.finish, agg.tokens, agg.reasoning_tokens) == ("tool_calls", 7, 3)


def test_an_empty_reasoning_is_still_seen_and_the_last_finish_wins():
    agg = Aggregate.of([Step(reasoning="", tokens=0), Step(content="x", finish="length", stop_reason=7, tokens=1),
                        Step(finish="stop", stop_reason="\n")])
    assert agg.saw_reasoning and agg.reasoning == "" and agg.content == "x"
    assert (agg.finish, agg.stop_reason) == ("stop", "\n")
    assert Aggregate.of([]) == Aggregate()


def test_the_embedding_is_a_deterministic_unit_vector_of_its_text():
    v = embedding_vector("hello")
    assert v == embedding_vector("hello") and v != embedding_vector("hello!")
    assert len(v) == 8 and len(embedding_vector("hello", dims=16)) == 16
    assert math.isclose(sum(x * x for x in v), 1.0, abs_tol=1e-5)
