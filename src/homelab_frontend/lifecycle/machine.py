"""A managed backend's life as a table: (state, event) -> state. Pure, no clock, no process.

The seven states are the policy's (swap_policy.UnitState). The fleet moves a unit only through `advance`,
which looks the move up here and raises `IllegalMove` for one the table does not hold, so a
wrong move is a loud bug where it happens, not a unit in a state nothing expects. The table is
the whole life cycle, read as h11's `_state.py` reads HTTP's:

    stopped  ──start──▶ starting ──up──▶ ready ──drain──▶ draining ──undrain──▶ ready
    failed   ──start──▶ starting                ready | draining ──stop──▶ stopping
    sleeping ──start──▶ starting (a wake)       sleeping ──stop──▶ stopping (its process must go)
    starting ──fail───▶ failed                  stopping ──exited──▶ stopped
    stopping ──slept──▶ sleeping                ready | draining | sleeping ──exited──▶ stopped (it died)
    any      ──abandon─▶ stopped (leadership lost, shutdown: the process was killed, or was never ours)
    any      ──takeover─▶ stopped (this replica now runs the servers: it starts from none running)

A replica that follows another (lifecycle/cluster.py) runs no machine: its units show the
leader's published word (`Managed.follow`), which is not a move of ours to check.

What the old record kept beside its state as flags lives here too:
- an effect in flight (a start, a stop) *is* the state: starting and stopping, nothing else;
- what should become of the process (`Goal`): keep it; stop it (an operator's stop, Ollama's
  keep_alive 0: drain, then stop); replace it later (its `run` changed: the next stop is a real
  one, not a sleep, and the next start spawns the new command); replace it now (drain, stop,
  spawn anew when asked); remove it (gone from the config: drain, stop, forget).
"""

from __future__ import annotations

from enum import Enum

from .swap_policy import UnitState


class Event(str, Enum):
    START = "start"  # a spawn, or a wake from sleep
    UP = "up"  # ready (or awake)
    FAIL = "fail"  # the start exited or timed out
    DRAIN = "drain"
    UNDRAIN = "undrain"
    STOP = "stop"
    SLEPT = "slept"  # the stop put it to sleep (unload: sleep)
    EXITED = "exited"  # the process is gone: stopped as asked, or died by itself
    ABANDON = "abandon"
    TAKEOVER = "takeover"


S, E = UnitState, Event
TRANSITIONS: dict[tuple[UnitState, Event], UnitState] = {
    (S.STOPPED, E.START): S.STARTING,
    (S.FAILED, E.START): S.STARTING,
    (S.SLEEPING, E.START): S.STARTING,
    (S.STARTING, E.UP): S.READY,
    (S.STARTING, E.FAIL): S.FAILED,
    (S.READY, E.DRAIN): S.DRAINING,
    (S.DRAINING, E.UNDRAIN): S.READY,
    (S.READY, E.STOP): S.STOPPING,
    (S.DRAINING, E.STOP): S.STOPPING,
    (S.SLEEPING, E.STOP): S.STOPPING,
    (S.STOPPING, E.SLEPT): S.SLEEPING,
    (S.STOPPING, E.EXITED): S.STOPPED,
    (S.READY, E.EXITED): S.STOPPED,
    (S.DRAINING, E.EXITED): S.STOPPED,
    (S.SLEEPING, E.EXITED): S.STOPPED,
    **{(s, E.ABANDON): S.STOPPED for s in UnitState},
    **{(s, E.TAKEOVER): S.STOPPED for s in UnitState},
}

# An effect (a task of the fleet's) is in flight exactly in these states.
BUSY = frozenset({UnitState.STARTING, UnitState.STOPPING})


class IllegalMove(RuntimeError):
    def __init__(self, name: str, state: UnitState, event: Event) -> None:
        super().__init__(f"backend {name!r}: no move {event.value!r} from {state.value!r}")
        self.state, self.event = state, event


def next_state(name: str, state: UnitState, event: Event) -> UnitState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalMove(name, state, event) from None


class Goal(int, Enum):
    """What should become of a unit's process, beside its state (see the docstring). Ordered:
    each one asks at least as much as the ones before it."""

    KEEP = 0
    STOP = 1  # drain, then stop (or sleep)
    REPLACE_LATER = 2  # serve on; the next stop is real and the next start spawns anew
    REPLACE = 3  # drain, stop for real, spawn anew when asked
    REMOVE = 4  # drain, stop for real, forget

    @property
    def evict(self) -> bool:
        """Drain and stop now."""
        return self in (Goal.STOP, Goal.REPLACE, Goal.REMOVE)

    @property
    def stale(self) -> bool:
        """The process must go (a sleep will not do)."""
        return self >= Goal.REPLACE_LATER

    def wanted(self) -> "Goal":
        """An operator's (or a client's) start: keep what runs; a change of `run` still waits."""
        return {Goal.STOP: Goal.KEEP, Goal.REPLACE: Goal.REPLACE_LATER}.get(self, self)

    def unwanted(self) -> "Goal":
        """An operator's stop: drain and stop (a pending replacement happens at that stop)."""
        return {Goal.KEEP: Goal.STOP, Goal.REPLACE_LATER: Goal.REPLACE}.get(self, self)

    def respawned(self) -> "Goal":
        """A new process from the current command: nothing left to replace."""
        return {Goal.REPLACE_LATER: Goal.KEEP, Goal.REPLACE: Goal.STOP}.get(self, self)

    def stopped(self) -> "Goal":
        """The process is gone: nothing left to stop; a replacement is spawned at the next start."""
        return Goal.REMOVE if self is Goal.REMOVE else Goal.KEEP
