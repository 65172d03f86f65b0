"""The request's phase table (request/phase.py) and its one owner (tracker.Tracked): random
sequences of the record's moves never leave the table's phases, an illegal move raises and
leaves the phase as it was, and whatever phase a request ends in, each cause gives it exactly
one outcome."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.request.outcome import DONE, FAILED, LEFT, OK, STALLED, SUPERSEDED, Cause, Ending, outcome_of
from homelab_frontend.request.phase import FINAL, MOVES, START, IllegalPhase, Phase, next_phase
from homelab_frontend.request.tracker import Tracked

# each of the record's moves, by the phase it asks for
MOVE_TO = {
    "queued": Phase.QUEUED,
    "loading": Phase.LOADING,
    "connecting": Phase.CONNECTING,
    "answering_stream": Phase.FIRST_TOKEN,
    "answering_whole": Phase.GENERATING,
    "generating": Phase.GENERATING,
    "streaming": Phase.STREAMING,
    "draining": Phase.DRAINING,
}
KINDS = ["overloaded", "rate_limit", "timeout", "upstream_midstream", "upstream_unreachable"]


def _record() -> Tracked:
    async def make() -> Tracked:
        return Tracked("req_phase", "openai", "m", None, True)
    return asyncio.run(make())


def _do(t: Tracked, move: str) -> None:
    if move == "answering_stream":
        t.answering(stream=True)
    elif move == "answering_whole":
        t.answering(stream=False)
    else:
        getattr(t, move)()


def _reachable() -> set[Phase]:
    seen, todo = {START}, [START]
    while todo:
        for nxt in MOVES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_table_covers_every_phase_and_every_phase_is_reachable():
    assert set(MOVES) == set(Phase)
    assert all(after <= set(Phase) for after in MOVES.values())
    assert _reachable() == set(Phase)
    assert FINAL == {Phase.DRAINING}


def test_the_phases_a_request_goes_through():
    t = _record()
    assert t.phase is Phase.QUEUED
    for move in ("loading", "queued", "connecting", "answering_stream", "streaming", "draining"):
        _do(t, move)
    assert t.phase is Phase.DRAINING
    assert t.as_dict()["phase"] == "draining" and type(t.as_dict()["phase"]) is str


def test_no_answer_without_a_connection_and_nothing_after_the_drain():
    t = _record()
    for move in ("answering_stream", "streaming", "generating", "draining"):
        with pytest.raises(IllegalPhase):
            _do(t, move)
        assert t.phase is Phase.QUEUED  # an illegal move changes nothing
    t.connecting(), t.draining()
    for move in MOVE_TO:
        with pytest.raises(IllegalPhase) as e:
            _do(t, move)
        assert "req_phase" in str(e.value) and "'draining'" in str(e.value)
    with pytest.raises(IllegalPhase):
        next_phase("r", Phase.STREAMING, Phase.LOADING)  # only a queued request waits for a load


@given(st.lists(st.sampled_from(sorted(MOVE_TO)), max_size=30))
def test_random_moves_follow_the_table_or_raise(moves):
    t = _record()
    for move in moves:
        before, to = t.phase, MOVE_TO[move]
        if to in MOVES[before]:
            _do(t, move)
            assert t.phase is to
        else:
            with pytest.raises(IllegalPhase):
                _do(t, move)
            assert t.phase is before
        assert t.phase in _reachable()


@given(st.lists(st.sampled_from(sorted(MOVE_TO)), max_size=20),
       st.sampled_from(list(Cause)), st.sampled_from(KINDS), st.booleans())
def test_every_phase_a_request_ends_in_gives_each_cause_one_outcome(moves, cause, kind, begun):
    t = _record()
    for move in moves:
        if MOVE_TO[move] in MOVES[t.phase]:
            _do(t, move)
    phase = t.phase
    t.end(cause, kind, begun=begun)
    assert t.ending == Ending(cause, phase, kind, begun)
    assert t.outcome == outcome_of(phase, cause, kind, begun) == t.ending.outcome
    # the same ending always reads the same, and a client that left names the phase it left in
    assert Ending(cause, phase, kind, begun).outcome == t.outcome
    if cause is LEFT:
        assert t.outcome == f"cancelled_{phase.value}"


def test_a_client_leaving_in_each_phase_is_a_distinct_outcome_naming_that_phase():
    labels = {outcome_of(p, LEFT) for p in Phase}
    assert len(labels) == len(Phase)
    assert {outcome_of(p, DONE) for p in Phase} == {OK}
    assert {outcome_of(p, STALLED) for p in Phase} == {"cancelled_client_stalled"}
    assert {outcome_of(p, SUPERSEDED) for p in Phase} == {"cancelled_superseded"}
    assert {outcome_of(p, FAILED, "timeout") for p in Phase} == {"error_timeout"}


def test_the_phase_and_the_outcome_are_the_records_own():
    t = _record()
    with pytest.raises(AttributeError):
        t.phase = Phase.STREAMING  # type: ignore[misc]  # read-only: the point of the test
    with pytest.raises(AttributeError):
        t.outcome = "ok"  # type: ignore[misc]  # read-only: the point of the test
    with pytest.raises(ValueError):
        t.end("exploded")  # an unknown cause is refused, and nothing is recorded
    assert t.ending is None and t.outcome == OK
