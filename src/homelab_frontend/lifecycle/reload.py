"""A reloaded config against the fleet's records: new managed backends, changed and removed ones.

A changed `run` (or `url`) of a backend whose process exists is replaced once its requests are
done (drain, stop for real, start the new command when asked); one gone from the config, or no
longer managed, is drained, stopped and forgotten. Failure back-offs start afresh on a change.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from .. import config as cfgmod
from . import swap_policy
from .machine import Aim, Goal
from .swap_policy import UnitState
from .unit import Managed

log = logging.getLogger("homelab_frontend.lifecycle")


def reconcile(units: dict[str, Managed], cfg: cfgmod.Config,
              on_change: Callable[[str, UnitState], None]) -> None:
    for name, b in cfg.backends.items():
        if b.run is None:
            continue
        u = units.get(name)
        if u is None:
            u = units[name] = Managed(name, b, on_change)
            if b.run.preload:
                u.wanted_at = time.monotonic()
            continue
        if u.goal is Goal.REMOVE:  # back in the config before it was forgotten: a new process
            u.aim(Aim.RETURN)
        if b.run != u.cfg.run or b.url != u.cfg.url:
            if u.state in swap_policy.HOLDING or u.state is UnitState.SLEEPING:
                log.info("backend %s: run changed: restarting once its requests are done", name)
                u.aim(Aim.CHANGE)  # drains, stops; starts again with the new cmd when asked
            u.failures, u.retry_at = 0, None
        u.cfg = b
    for name, u in units.items():
        kept = cfg.backends.get(name)
        if kept is None or kept.run is None:
            u.aim(Aim.DROP)
