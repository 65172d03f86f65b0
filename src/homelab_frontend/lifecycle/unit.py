"""One managed backend's live record (`Managed`) and the gate on its slot queue (`Door`).

The record moves between states only through `advance`, and its goal only through `aim`
(machine.py's tables; an illegal move raises). A replica that follows another shows the leader's word through `follow` instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Callable, Protocol

from .. import config as cfgmod
from ..admission.slots import SlotStore
from ..errors import GatewayError
from . import swap_policy
from .keep_alive import Forever, idle_ttl
from .logring import LogRing
from .machine import Aim, Event, Goal, next_goal, next_state
from .swap_policy import UnitState
from .process import describe_status

log = logging.getLogger("homelab_frontend.lifecycle")


class Process(Protocol):
    """A running server as the fleet uses it (process.Child, or a test's stand-in)."""

    pid: int
    exited: asyncio.Future[int]

    @property
    def running(self) -> bool: ...

    async def stop(self, timeout_s: float) -> int: ...

    def kill(self) -> None: ...

    def close_pipe(self) -> None: ...


class Managed:
    """One managed backend's live record."""

    def __init__(self, name: str, cfg: cfgmod.Backend, on_change: Callable[[str, UnitState], None] | None = None) -> None:
        self.name = name
        self.on_change = on_change
        self.cfg = cfg
        self.state = UnitState.STOPPED
        self.since = time.time()
        self._goal = Goal.KEEP  # what should become of its process (machine.Goal): moved by `aim`
        self.pool: SlotStore | None = None  # the backend's slot pool; its queue's gate is a Door
        self.child: Process | None = None
        self.log = LogRing()
        self.last_used = time.monotonic()
        self.last_exit: int | None = None
        self.last_start_s: float | None = None
        self.error: str | None = None  # the last failure, as its 503 said it
        self.failures = 0  # consecutive failed starts
        self.retry_at: float | None = None
        self.wanted_at: float | None = None  # preload / operator's start
        self.effect: asyncio.Task[None] | None = None  # the start or stop in flight (state starting/stopping)
        self.remote: dict[str, Any] | None = None  # a follower's mirror of the leader's record (lifecycle/cluster.py)
        # A client's keep_alive (keep_alive.py) in place of run.idle_ttl_s, within run.client_keep_alive
        self.keep_alive: float | Forever | None = None

    @property
    def run(self) -> cfgmod.Run:
        assert self.cfg.run is not None
        return self.cfg.run

    @property
    def goal(self) -> Goal:
        return self._goal

    def aim(self, aim: Aim) -> Goal:
        """Move the goal (machine.GOAL_MOVES); raises machine.IllegalAim for a move it lacks."""
        goal = next_goal(self.name, self._goal, aim)
        if goal is not self._goal:
            log.debug("backend %s: goal %s -> %s (%s)", self.name, self._goal.name, goal.name, aim.value)
            self._goal = goal
        return goal

    @property
    def evict(self) -> bool:
        return self.goal.evict

    @property
    def stale(self) -> bool:
        return self.goal.stale

    @property
    def removed(self) -> bool:
        return self.goal is Goal.REMOVE

    def advance(self, event: Event) -> UnitState:
        """Apply `event` (machine.TRANSITIONS); raises machine.IllegalMove for a move it lacks."""
        self._become(next_state(self.name, self.state, event))
        return self.state

    def follow(self, state: UnitState) -> None:
        """A follower: the leader's published state, taken as it is (no move of ours)."""
        self._become(state)

    def _become(self, state: UnitState) -> None:
        if state is not self.state:
            log.info("backend %s: %s -> %s", self.name, self.state.value, state.value)
            self.state, self.since = state, time.time()
            self.log.mark(f"-- gateway: {state.value}")
            if self.pool is not None:
                self.pool.queue.set_loading(state is UnitState.STARTING)
            if self.on_change is not None:
                self.on_change(self.name, state)

    def view(self, remote_want: tuple[int, float | None] | None = None, remote_used: float = 0.0) -> swap_policy.Unit:
        pool = self.pool
        waiting = pool.queue.queued if pool is not None else 0
        oldest = pool.queue.oldest_wait() if pool is not None else None
        if remote_want is not None and remote_want[1] is not None:  # other replicas' waiting requests
            waiting += remote_want[0]
            oldest = remote_want[1] if oldest is None else min(oldest, remote_want[1])
        if self.wanted_at is not None:
            oldest = self.wanted_at if oldest is None else min(oldest, self.wanted_at)
        return swap_policy.Unit(
            name=self.name, state=self.state, uses=self.run.uses,
            held=pool.in_use if pool is not None else 0, waiting=waiting, oldest_wait=oldest,
            last_used=max(self.last_used, remote_used), idle_ttl_s=self.idle_ttl_s, retry_at=self.retry_at,
            wanted=self.wanted_at is not None, evict=self.evict,
        )

    @property
    def idle_ttl_s(self) -> float | None:
        run = self.run
        return idle_ttl(self.keep_alive, run.client_keep_alive, run.idle_ttl_s)

    def as_dict(self) -> dict[str, Any]:
        in_use = self.pool.in_use if self.pool is not None else 0
        waiting = self.pool.queue.queued if self.pool is not None else 0
        if self.remote is not None:  # a follower: the leader's word, and where it runs
            return {**self.remote, "name": self.name, "managed": True, "state": self.state.value,
                    "in_use": in_use, "waiting": waiting}
        return {
            "name": self.name, "managed": True, "state": self.state.value, "since": self.since,
            "pid": self.child.pid if self.child is not None and self.child.running else None,
            "last_exit_status": self.last_exit,
            "last_exit": describe_status(self.last_exit) if self.last_exit is not None else None,
            "last_start_s": round(self.last_start_s, 3) if self.last_start_s is not None else None,
            "error": self.error, "uses": dict(self.run.uses), "unload": self.run.unload,
            "idle_ttl_s": self.idle_ttl_s, "in_use": in_use, "waiting": waiting,
            # rounded up: a 0 is a promise that the next request starts it (rounded to the nearest,
            # the last 50 ms of a back-off read 0 and a request then was still refused with a 503)
            "retry_in_s": math.ceil(max(0.0, self.retry_at - time.monotonic()) * 10) / 10 if self.retry_at else None,
        }


class Admitter(Protocol):
    """What a Door asks of the fleet (fleet.Fleet)."""

    def admits(self, name: str) -> bool: ...

    def refusal(self, name: str) -> GatewayError | None: ...

    def slot_event(self, name: str) -> None: ...

    def load_eta_s(self, name: str) -> float: ...


class Door:
    """The gate (admission.slots.Gate) on a managed backend's queue: it admits what the policy
    admits, refuses at once during a failed start's back-off, and tells the fleet of every slot
    event (the fleet wakes its loop only for those that move the demand: fleet.Fleet.slot_event)."""

    __slots__ = ("fleet", "name")

    def __init__(self, fleet: Admitter, name: str) -> None:
        self.fleet = fleet
        self.name = name

    def admits(self) -> bool:
        return self.fleet.admits(self.name)

    def refusal(self) -> GatewayError | None:
        return self.fleet.refusal(self.name)

    def changed(self) -> None:
        self.fleet.slot_event(self.name)

    def load_s(self) -> float:
        return self.fleet.load_eta_s(self.name)
