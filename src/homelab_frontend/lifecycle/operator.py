"""What the operator (the admin API) and a client's keep_alive (Ollama's API) ask of the fleet:
start a backend now, stop it once its requests are done, keep it up so long, and the view."""

from __future__ import annotations

import time
from typing import Any

from . import policy
from .policy import State
from .unit import Managed


class OperatorApi:
    """Mixed into `Fleet` (fleet.py), whose state it shares."""

    units: dict[str, Managed]
    coord: Any

    def kick(self) -> None: ...

    def want(self, name: str) -> dict:
        u = self.units[name]
        u.goal = u.goal.wanted()
        if u.state is State.FAILED:
            u.retry_at = None  # the operator asks for a try now
        if u.state is not State.READY:
            u.wanted_at = time.monotonic()
        self.kick()
        return u.as_dict()

    def unwant(self, name: str) -> dict:
        u = self.units[name]
        u.wanted_at = None
        if u.state in policy.HOLDING:
            u.goal = u.goal.unwanted()
        self.kick()
        return u.as_dict()

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """A client's `keep_alive` (Ollama's API): the backend stays up this long after its last
        request (None: until swapped out or stopped), in place of `run.idle_ttl_s` until the next
        one says otherwise; 0 unloads it once its running requests finish, as Ollama does."""
        u = self.units.get(name)
        if u is None or u.removed:
            return
        if seconds == 0:
            u.keep_alive = None
            self.unwant(name)
            return
        u.keep_alive = (seconds,)
        self.kick()

    def snapshot(self) -> list[dict]:
        out = [u.as_dict() for u in self.units.values() if not u.removed]
        if self.coord is not None:  # which replica runs them (None: nobody holds the lease now)
            for d in out:
                d["leader"] = self.coord.replica if self.coord.leader else self.coord.leader_id
        return out
