"""The managed backend's moves (lifecycle/machine.py): the table, illegal moves, and the goal
beside the state, over generated event sequences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.lifecycle.machine import BUSY, TRANSITIONS, Event, Goal, IllegalMove, next_state
from homelab_frontend.lifecycle.swap_policy import HOLDING, STARTABLE, UnitState


def test_every_state_is_reachable_from_stopped_and_stopped_from_every_state():
    seen, frontier = {UnitState.STOPPED}, [UnitState.STOPPED]
    while frontier:
        s = frontier.pop()
        for (a, _), b in TRANSITIONS.items():
            if a is s and b not in seen:
                seen.add(b)
                frontier.append(b)
    assert seen == set(UnitState)
    assert all(TRANSITIONS[(s, Event.ABANDON)] is UnitState.STOPPED for s in UnitState)


def test_a_start_only_from_a_startable_state_and_ready_only_after_starting():
    assert {s for (s, e) in TRANSITIONS if e is Event.START} == STARTABLE
    assert {s for (s, e), t in TRANSITIONS.items() if t is UnitState.READY} == {UnitState.STARTING, UnitState.DRAINING}


def test_illegal_moves_raise_with_the_backend_and_the_move():
    with pytest.raises(IllegalMove) as ei:
        next_state("a", UnitState.STOPPED, Event.UP)
    assert "'a'" in str(ei.value) and "up" in str(ei.value) and "stopped" in str(ei.value)
    with pytest.raises(IllegalMove):
        next_state("a", UnitState.READY, Event.START)  # a second process beside the running one
    with pytest.raises(IllegalMove):
        next_state("a", UnitState.STARTING, Event.STOP)  # a start is never stopped half-way but by abandon


@given(st.lists(st.sampled_from(list(Event)), max_size=60))
def test_any_event_sequence_stays_in_the_table_and_busy_states_are_entered_only_by_start_or_stop(events):
    s = UnitState.STOPPED
    for e in events:
        try:
            t = next_state("a", s, e)
        except IllegalMove:
            assert (s, e) not in TRANSITIONS
            continue
        if t in BUSY and t is not s:
            assert e in (Event.START, Event.STOP)
        if s in BUSY and t not in BUSY:  # an effect ends only by its own outcome, or abandon
            assert e in (Event.UP, Event.FAIL, Event.SLEPT, Event.EXITED, Event.ABANDON, Event.TAKEOVER)
        s = t
    assert BUSY <= HOLDING


@given(st.lists(st.sampled_from(["wanted", "unwanted", "stopped", "respawned"]), max_size=30),
       st.sampled_from(list(Goal)))
def test_the_goal_never_forgets_a_removal_and_a_stop_clears_all_but_it(ops, g):
    for op in ops:
        before = g
        g = getattr(g, op)()
        if before is Goal.REMOVE:
            assert g is Goal.REMOVE
        if op == "stopped":
            assert g in (Goal.KEEP, Goal.REMOVE)
        if op == "unwanted":
            assert g.evict
        if op == "wanted" and before is not Goal.REMOVE:
            assert not g.evict
