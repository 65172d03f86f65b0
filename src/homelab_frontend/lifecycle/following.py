"""The fleet's side of lifecycle/cluster.py: with replicas, one (the leader) runs every managed
server; the others follow its published states. These are the Coordinator's callbacks."""

from __future__ import annotations

import time
from typing import Any

from .machine import Event
from .swap_policy import UnitState
from .unit import Managed


class Following:
    """Mixed into `Fleet` (fleet.py), whose state it shares."""

    units: dict[str, Managed]

    def kick(self) -> None: ...

    def mirror(self, states: dict[str, Any]) -> None:
        """A follower: the leader's states are this replica's view of its backends."""
        for name, u in self.units.items():
            doc = states.get(name)
            u.remote = doc if isinstance(doc, dict) else {}
            try:
                state = UnitState(u.remote.get("state", "stopped"))
            except ValueError:
                state = UnitState.STOPPED
            u.follow(state)
        self.kick()

    def became_leader(self) -> None:
        for u in self.units.values():
            u.remote = None
            u.advance(Event.TAKEOVER)  # the old leader's servers died with it (or were stopped by it)
            if u.run.preload:
                u.wanted_at = time.monotonic()
        self.kick()

    def lost_leadership(self) -> None:
        """Another replica may start these servers now: ours go at once."""
        for u in self.units.values():
            if u.effect is not None:
                u.effect.cancel()
                u.effect = None
            if u.child is not None and u.child.running:
                u.child.kill()
            u.advance(Event.ABANDON)
            u.goal = u.goal.stopped()
        self.kick()


