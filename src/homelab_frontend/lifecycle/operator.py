"""What the operator (the admin API) and a client's keep_alive (keep_alive.py) ask of the fleet:
start a backend now, stop it once its requests are done, keep it up so long, and the view."""

from __future__ import annotations

import time
from typing import Any

from . import swap_policy
from .keep_alive import Forever, unloads
from .swap_policy import UnitState
from .unit import Managed


class OperatorApi:
    """Mixed into `Fleet` (fleet.py), whose state it shares."""

    units: dict[str, Managed]
    coord: Any

    def kick(self) -> None: ...

    def want(self, name: str) -> dict[str, Any]:
        u = self.units[name]
        u.goal = u.goal.wanted()
        if u.state is UnitState.FAILED:
            u.retry_at = None  # the operator asks for a try now
        if u.state is not UnitState.READY:
            u.wanted_at = time.monotonic()
        self.kick()
        return u.as_dict()

    def unwant(self, name: str) -> dict[str, Any]:
        u = self.units[name]
        u.wanted_at = None
        if u.state in swap_policy.HOLDING:
            u.goal = u.goal.unwanted()
        self.kick()
        return u.as_dict()

    def keep_alive(self, name: str, asked: float | Forever, *, prompt: bool = True) -> None:
        """A client's `keep_alive` (keep_alive.py): the backend's idle time from this request on,
        within what its `run.client_keep_alive` allows; 0 without a prompt unloads it once its
        running requests finish, as Ollama does."""
        u = self.units.get(name)
        if u is None or u.removed:
            return
        rule = u.run.client_keep_alive
        if not rule.honour:
            return
        if unloads(asked, rule, prompt=prompt):
            u.keep_alive = None  # started again later, it has the operator's idle time
            self.unwant(name)
            return
        u.keep_alive = asked
        self.kick()

    def snapshot(self) -> list[dict[str, Any]]:
        out = [u.as_dict() for u in self.units.values() if not u.removed]
        if self.coord is not None:  # which replica runs them (None: nobody holds the lease now)
            for d in out:
                d["leader"] = self.coord.replica if self.coord.leader else self.coord.leader_id
        return out
