"""lifecycle/following.py, through the fleet's callbacks that call it: a follower mirrors the leader's published states (an unknown or
missing one reads as stopped); a replica that becomes leader starts from stopped and wants its
preloads again; one that loses the lease kills its servers and cancels what it had in flight."""

from __future__ import annotations

import asyncio

from homelab_frontend.lifecycle import following
from homelab_frontend.lifecycle.fleet import Fleet
from homelab_frontend.lifecycle.machine import Aim, Event, Goal
from homelab_frontend.lifecycle.swap_policy import UnitState
from homelab_frontend.lifecycle.unit import Managed

from support.managed_config import config

CFG = config(a={"preload": True}, b={})


class _Fleet(Fleet):
    """The fleet without its loop, counting its wake-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.units = {n: Managed(n, b) for n, b in CFG.backends.items()}
        self.kicks = 0

    def kick(self) -> None:
        self.kicks += 1
        super().kick()


def test_a_follower_mirrors_the_leaders_states_and_reads_nonsense_as_stopped():
    f = _Fleet()
    f.mirror({"a": {"state": "ready", "pid": 7}, "b": {"state": "exploded"}})
    assert f.units["a"].state is UnitState.READY and f.units["a"].as_dict()["pid"] == 7
    assert f.units["b"].state is UnitState.STOPPED
    f.mirror({"a": "not a record"})  # and a backend the leader does not mention
    assert f.units["a"].state is UnitState.STOPPED and f.units["a"].remote == {}
    assert f.units["b"].state is UnitState.STOPPED
    assert f.kicks == 2


def test_the_mirror_is_a_function_of_the_units_alone():
    units = {n: Managed(n, b) for n, b in CFG.backends.items()}
    following.mirror(units, {"b": {"state": "starting"}})
    assert units["b"].state is UnitState.STARTING and units["a"].state is UnitState.STOPPED
    following.became_leader(units)
    assert units["b"].state is UnitState.STOPPED and units["a"].wanted_at is not None


def test_a_new_leader_starts_from_stopped_and_wants_its_preloads():
    f = _Fleet()
    f.mirror({"a": {"state": "ready"}, "b": {"state": "sleeping"}})
    f.became_leader()
    assert all(u.state is UnitState.STOPPED and u.remote is None for u in f.units.values())
    assert f.units["a"].wanted_at is not None and f.units["b"].wanted_at is None


class _Child:
    def __init__(self) -> None:
        self.running = True
        self.killed = False

    def kill(self) -> None:
        self.killed = True
        self.running = False


def test_a_replica_that_loses_the_lease_kills_its_servers_and_cancels_their_effects():
    async def main():
        f = _Fleet()
        a = f.units["a"]
        a.advance(Event.START)
        a.child = _Child()
        a.effect = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        effect = a.effect
        a.aim(Aim.UNWANT)
        f.units["b"].aim(Aim.DROP)
        f.lost_leadership()
        await asyncio.sleep(0)
        return f, a, effect

    f, a, effect = asyncio.run(main())
    assert effect.cancelled() and a.effect is None and a.child.killed
    assert a.state is UnitState.STOPPED and a.goal is Goal.KEEP  # nothing left to stop
    assert f.units["b"].goal is Goal.REMOVE  # still to be forgotten
