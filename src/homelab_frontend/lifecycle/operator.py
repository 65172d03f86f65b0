"""What the operator (the admin API) and a client's keep_alive (keep_alive.py) ask of a unit:
start it now, stop it once its requests are done, keep it up so long, and the view. Functions of
a unit's record; `Fleet` (fleet.py) calls them and wakes its loop."""

from __future__ import annotations

import time
from typing import Any

from . import swap_policy
from .cluster import Coordinator
from .keep_alive import Forever, unloads
from .machine import Aim
from .swap_policy import UnitState
from .unit import Managed


def want(u: Managed) -> None:
    u.aim(Aim.WANT)
    if u.state is UnitState.FAILED:
        u.retry_at = None  # the operator asks for a try now
    if u.state is not UnitState.READY:
        u.wanted_at = time.monotonic()


def unwant(u: Managed) -> None:
    u.wanted_at = None
    if u.state in swap_policy.HOLDING:
        u.aim(Aim.UNWANT)


def keep_alive(u: Managed, asked: float | Forever, *, prompt: bool = True) -> bool:
    """A client's `keep_alive` (keep_alive.py): the backend's idle time from this request on,
    within what its `run.client_keep_alive` allows; 0 without a prompt unloads it once its
    running requests finish, as Ollama does. -> whether anything changed."""
    if u.removed:
        return False
    rule = u.run.client_keep_alive
    if not rule.honour:
        return False
    if unloads(asked, rule, prompt=prompt):
        u.keep_alive = None  # started again later, it has the operator's idle time
        unwant(u)
        return True
    u.keep_alive = asked
    return True


def snapshot(units: dict[str, Managed], coord: Coordinator | None) -> list[dict[str, Any]]:
    out = [u.as_dict() for u in units.values() if not u.removed]
    if coord is not None:  # which replica runs them (None: nobody holds the lease now)
        for d in out:
            d["leader"] = coord.replica if coord.leader else coord.leader_id
    return out
