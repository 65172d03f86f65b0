"""The fleet's side of lifecycle/cluster.py: with replicas, one (the leader) runs every managed
server; the others follow its published states. Functions of the units; `Fleet` (fleet.py) calls
them for the Coordinator's callbacks and wakes its loop."""

from __future__ import annotations

import time
from typing import Any

from .machine import Aim, Event
from .swap_policy import UnitState
from .unit import Managed


def mirror(units: dict[str, Managed], states: dict[str, Any]) -> None:
    """A follower: the leader's states are this replica's view of its backends."""
    for name, u in units.items():
        doc = states.get(name)
        u.remote = doc if isinstance(doc, dict) else {}
        try:
            state = UnitState(u.remote.get("state", "stopped"))
        except ValueError:
            state = UnitState.STOPPED
        u.follow(state)


def became_leader(units: dict[str, Managed]) -> None:
    for u in units.values():
        u.remote = None
        u.advance(Event.TAKEOVER)  # the old leader's servers died with it (or were stopped by it)
        if u.run.preload:
            u.wanted_at = time.monotonic()


def lost_leadership(units: dict[str, Managed]) -> None:
    """Another replica may start these servers now: ours go at once."""
    for u in units.values():
        if u.effect is not None:
            u.effect.cancel()
            u.effect = None
        if u.child is not None and u.child.running:
            u.child.kill()
        u.advance(Event.ABANDON)
        u.aim(Aim.GONE)
