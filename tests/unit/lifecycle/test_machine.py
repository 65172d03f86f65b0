"""The managed backend's moves (lifecycle/machine.py): the table, illegal moves, and the goal
beside the state, over generated event sequences."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.lifecycle.machine import (BUSY, GOAL_MOVES, TRANSITIONS, Aim, Event, Goal, IllegalAim, IllegalMove,
                                                next_goal, next_state)
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


@given(st.lists(st.sampled_from(list(Aim)), max_size=30), st.sampled_from(list(Goal)))
def test_the_goal_never_forgets_a_removal_but_by_a_return_and_a_stop_clears_all_but_it(aims, g):
    for aim in aims:
        before = g
        try:
            g = next_goal("a", g, aim)
        except IllegalAim:
            assert (before, aim) not in GOAL_MOVES
            assert (aim is Aim.RETURN) is (before is not Goal.REMOVE)  # the only holes in the table
            continue
        if before is Goal.REMOVE and aim is not Aim.RETURN:
            assert g is Goal.REMOVE
        if aim is Aim.GONE:
            assert g in (Goal.KEEP, Goal.REMOVE)
        if aim is Aim.UNWANT:
            assert g.evict
        if aim in (Aim.WANT, Aim.SLEPT) and before is not Goal.REMOVE:
            assert not g.evict
        if aim is Aim.RESPAWN:
            assert g is Goal.REMOVE or not g.stale  # the new process is the current command


def test_the_goal_table_holds_every_move_but_a_return_of_what_was_not_removed_and_a_change_of_what_was():
    holes = {(g, a) for g in Goal for a in Aim} - set(GOAL_MOVES)
    assert holes == {(g, Aim.RETURN) for g in Goal if g is not Goal.REMOVE} | {(Goal.REMOVE, Aim.CHANGE)}
    assert GOAL_MOVES[(Goal.REMOVE, Aim.RETURN)] is Goal.REPLACE
    assert all(GOAL_MOVES[(g, Aim.DROP)] is Goal.REMOVE for g in Goal)


def test_an_illegal_goal_move_raises_with_the_backend_and_the_move():
    with pytest.raises(IllegalAim) as ei:
        next_goal("a", Goal.KEEP, Aim.RETURN)
    assert "'a'" in str(ei.value) and "return" in str(ei.value) and "keep" in str(ei.value)
    with pytest.raises(IllegalAim):
        next_goal("a", Goal.REMOVE, Aim.CHANGE)  # a removed backend comes back only by a return
