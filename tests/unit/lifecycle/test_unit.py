"""lifecycle/unit.py: a managed backend's record and the Door on its queue. The record moves only
through machine.py's table (an illegal move raises and changes nothing), a follower takes the
leader's word as it is, every change is told once (the listener, the queue's loading clock), the
policy's view of it merges other replicas' demand and an operator's start, a client's keep_alive
overrides the configured idle time, and the Door asks the fleet."""

from __future__ import annotations

import asyncio

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.admission.slots import SlotPool
from homelab_frontend.errors import GatewayError
from homelab_frontend.lifecycle.keep_alive import FOREVER
from homelab_frontend.lifecycle.machine import Aim, Event, Goal, IllegalAim, IllegalMove
from homelab_frontend.lifecycle.swap_policy import UnitState
from homelab_frontend.lifecycle.unit import Door, Managed

CFG = cfgmod.parse({"backends": {"b": {"url": "http://127.0.0.1:9/b/v1", "slots": 2,
                                       "run": {"cmd": ["b"], "uses": {"gpu": 1}, "idle_ttl_s": 300}}},
                    "models": {"m": {"backend": "b"}}, "resources": {"gpu": 1}}).backends["b"]


def _unit(changes: list | None = None) -> Managed:
    return Managed("b", CFG, on_change=(lambda n, s: changes.append((n, s))) if changes is not None else None)


def test_a_record_moves_through_the_table_and_tells_each_change_once():
    changes: list = []
    u = _unit(changes)
    assert u.state is UnitState.STOPPED
    assert u.advance(Event.START) is UnitState.STARTING
    assert u.advance(Event.UP) is UnitState.READY
    u.follow(UnitState.READY)  # no change, nothing told
    assert changes == [("b", UnitState.STARTING), ("b", UnitState.READY)]
    assert list(u.log.lines) == ["-- gateway: starting", "-- gateway: ready"]  # the operator sees each in its log


def test_an_illegal_move_raises_and_leaves_the_record_as_it_was():
    changes: list = []
    u = _unit(changes)
    with pytest.raises(IllegalMove):
        u.advance(Event.UP)  # stopped cannot become ready without a start
    assert u.state is UnitState.STOPPED and changes == []


def test_the_goal_moves_only_by_an_aim_and_an_illegal_one_leaves_it_as_it_was():
    u = _unit()
    assert u.goal is Goal.KEEP and not u.evict
    with pytest.raises(AttributeError):
        u.goal = Goal.REMOVE  # type: ignore[misc]  # what this test proves: no assignment from outside
    assert u.aim(Aim.UNWANT) is Goal.STOP and u.evict and not u.stale
    assert u.aim(Aim.CHANGE) is Goal.REPLACE and u.stale
    with pytest.raises(IllegalAim):
        u.aim(Aim.RETURN)  # it was never removed
    assert u.goal is Goal.REPLACE
    assert u.aim(Aim.DROP) is Goal.REMOVE and u.removed
    with pytest.raises(IllegalAim):
        u.aim(Aim.CHANGE)  # a removed one comes back by a return, not by a change of its run
    assert u.aim(Aim.RETURN) is Goal.REPLACE and not u.removed


def test_a_follower_takes_the_leaders_state_without_a_move_of_its_own():
    u = _unit()
    u.follow(UnitState.SLEEPING)  # no single move from stopped: the leader's word all the same
    assert u.state is UnitState.SLEEPING


def test_the_queues_loading_clock_runs_only_while_the_server_starts():
    async def main():
        u = _unit()
        u.pool = SlotPool("b", 2, 8, 5.0)
        seen = []
        u.pool.queue.set_loading = seen.append
        u.advance(Event.START)
        u.advance(Event.UP)
        return seen

    assert asyncio.run(main()) == [True, False]


def test_a_clients_keep_alive_overrides_the_configured_idle_time():
    u = _unit()
    assert u.idle_ttl_s == 300
    u.keep_alive = 60.0
    assert u.idle_ttl_s == 60.0 and u.view().idle_ttl_s == 60.0
    u.keep_alive = FOREVER
    assert u.idle_ttl_s is None


def test_the_policys_view_merges_other_replicas_demand_and_an_operators_start():
    async def main():
        u = _unit()
        u.pool = SlotPool("b", 2, 8, 5.0)
        alone = u.view()
        u.wanted_at = 50.0
        wanted = u.view(remote_want=(3, 40.0), remote_used=u.last_used + 10)
        only_operator = u.view(remote_want=(0, None))
        return u, alone, wanted, only_operator

    u, alone, wanted, only_operator = asyncio.run(main())
    assert (alone.waiting, alone.oldest_wait, alone.wanted) == (0, None, False)
    assert (wanted.waiting, wanted.oldest_wait, wanted.wanted) == (3, 40.0, True)
    assert wanted.last_used == u.last_used + 10
    assert (only_operator.waiting, only_operator.oldest_wait) == (0, 50.0)


def test_a_followers_record_is_the_leaders_with_its_own_state_and_queue():
    u = _unit()
    u.remote = {"pid": 4242, "error": None, "state": "stale", "name": "other"}
    u.follow(UnitState.READY)
    d = u.as_dict()
    assert d["pid"] == 4242 and d["state"] == "ready" and d["name"] == "b" and d["managed"] is True


def test_a_leaders_record_says_its_own_process_and_last_exit():
    u = _unit()
    u.last_exit, u.error = -9, "it died"
    d = u.as_dict()
    assert d["pid"] is None and d["last_exit_status"] == -9 and d["last_exit"] and d["error"] == "it died"
    assert d["retry_in_s"] is None and d["idle_ttl_s"] == 300


class _Fleet:
    def __init__(self) -> None:
        self.calls: list = []

    def admits(self, name):
        self.calls.append(("admits", name))
        return name == "b"

    def refusal(self, name):
        return GatewayError("backend_down", f"{name} is backing off")

    def slot_event(self, name):
        self.calls.append(("slot_event", name))

    def load_eta_s(self, name):
        return 42.0


def test_the_door_asks_the_fleet_and_tells_it_of_every_change():
    fleet = _Fleet()
    door = Door(fleet, "b")
    assert door.admits() and not Door(fleet, "c").admits()
    assert door.refusal().kind == "backend_down"
    door.changed()
    assert fleet.calls[-1] == ("slot_event", "b")
    assert door.load_s() == 42.0
