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

A unit's `Goal` moves the same way, through `GOAL_MOVES` ((goal, aim) -> goal) by `Managed.aim`;
`IllegalAim` for a move the table lacks (a return of a backend that was never removed, a change
of one that is).

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
    each one asks at least as much as the ones before it. It moves only through `GOAL_MOVES`."""

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


class Aim(str, Enum):
    """What moves a unit's goal (GOAL_MOVES)."""

    WANT = "want"  # an operator's (or a client's) start: keep what runs; a change of `run` still waits
    UNWANT = "unwant"  # an operator's stop (keep_alive 0): drain and stop; a pending replacement happens then
    SLEPT = "slept"  # a stop that left the process (asleep, or cut short): nothing left to stop
    RESPAWN = "respawn"  # a new process from the current command: nothing left to replace
    GONE = "gone"  # the process is gone: nothing left to stop; a replacement is spawned at the next start
    CHANGE = "change"  # its `run` changed while a process exists: drain, stop, spawn the new command
    DROP = "drop"  # gone from the config (or no longer managed): drain, stop, forget
    RETURN = "return"  # back in the config before it was forgotten: a new process


G, A = Goal, Aim
GOAL_MOVES: dict[tuple[Goal, Aim], Goal] = {
    **{(g, A.WANT): {G.STOP: G.KEEP, G.REPLACE: G.REPLACE_LATER}.get(g, g) for g in Goal},
    **{(g, A.SLEPT): {G.STOP: G.KEEP, G.REPLACE: G.REPLACE_LATER}.get(g, g) for g in Goal},
    **{(g, A.UNWANT): {G.KEEP: G.STOP, G.REPLACE_LATER: G.REPLACE}.get(g, g) for g in Goal},
    **{(g, A.RESPAWN): {G.REPLACE_LATER: G.KEEP, G.REPLACE: G.STOP}.get(g, g) for g in Goal},
    **{(g, A.GONE): G.REMOVE if g is G.REMOVE else G.KEEP for g in Goal},
    # a removed one is first brought back (RETURN): a change never resurrects it by itself
    **{(g, A.CHANGE): G.REPLACE for g in Goal if g is not G.REMOVE},
    **{(g, A.DROP): G.REMOVE for g in Goal},
    (G.REMOVE, A.RETURN): G.REPLACE,
}


class IllegalAim(RuntimeError):
    def __init__(self, name: str, goal: Goal, aim: Aim) -> None:
        super().__init__(f"backend {name!r}: no goal move {aim.value!r} from {goal.name.lower()!r}")
        self.goal, self.aim = goal, aim


def next_goal(name: str, goal: Goal, aim: Aim) -> Goal:
    try:
        return GOAL_MOVES[(goal, aim)]
    except KeyError:
        raise IllegalAim(name, goal, aim) from None
