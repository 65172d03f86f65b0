"""The swap policy: which managed backends to start, which to drain and stop, and when. Pure.

A managed backend (`run:` in the config) is a unit in one of seven states:

    stopped ──start──▶ starting ──ready──▶ ready ──drain──▶ draining ──(no slot held)──▶ stopping ──exit──▶ stopped
       ▲                  │                  │  ◀──undrain──┘                                 (unload: sleep)──▶ sleeping
       └──back-off──── failed ◀──exit / start timeout                                                   sleeping ──wake──▶ starting

`decide` looks at a snapshot of every unit (its state, what it `uses` of the shared
`resources`, the slots it holds, the requests waiting for it and since when) and returns the
actions to take now, plus the moment the answer could change on its own (an idle TTL running
out, a wait becoming overdue, a back-off ending) so the caller knows when to ask again. It owns
no clock, no process and no socket: `fleet.py` performs what it decides (moving each unit through
machine.py's table) and calls it again on every event (a request arriving or ending, a server
ready or exited). Deciding apart from doing is what lets tests/unit/lifecycle drive the policy
through thousands of generated situations without a process.

The rules (what the issue calls "don't swap a model out while a long job runs on it" and
"queue to cut swap thrash"):
- Resources are held from the start of a spawn until the process has *exited* (or finished
  going to sleep): a unit in starting, ready, draining or stopping holds its `uses`; stopped,
  sleeping and failed hold none. A start happens only when its `uses` fit in what is free now.
- A backend holding a slot is never stopped: making room means draining it (no new admissions,
  its running requests finish), and it stops once no slot is held.
- Who gets the room: the unit whose oldest waiting request arrived first. It may evict ready
  units that hold no slot and have nobody waiting (least recently used first), units with
  running requests but an empty queue (what was queued for them has been served), and, once
  its own oldest request has waited `swap_after_s`, any ready unit: so a model with a steady
  queue is served in batches, and nobody starves.
- `fifo` (llama-swap's order, for bench.swap's comparison) admits strictly in arrival order
  across units: a request waits while an older one, for any backend, waits; eviction is
  immediate. Equivalent to `batch` with swap_after_s = 0 and no overtaking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping, Sequence


class UnitState(str, Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    SLEEPING = "sleeping"
    FAILED = "failed"


# The states in which a unit holds its `uses` (a process exists that may hold the GPU).
HOLDING = frozenset({UnitState.STARTING, UnitState.READY, UnitState.DRAINING, UnitState.STOPPING})
# The states from which a start (a spawn, or a wake from sleep) is possible.
STARTABLE = frozenset({UnitState.STOPPED, UnitState.SLEEPING, UnitState.FAILED})


@dataclass(frozen=True)
class Unit:
    """One managed backend as the policy sees it at one moment."""

    name: str
    state: UnitState
    uses: Mapping[str, float] = field(default_factory=dict)
    held: int = 0  # slots held by running requests
    waiting: int = 0  # requests waiting for it (admission's queue for this backend)
    oldest_wait: float | None = None  # when its longest-waiting request (or a `wanted` start) began to wait
    last_used: float = 0.0  # when its last request ended (or it became ready): idle TTL and LRU
    idle_ttl_s: float | None = None
    retry_at: float | None = None  # failed: no new start before this (back-off)
    wanted: bool = False  # preload or an operator's start: a demand without a request
    evict: bool = False  # an operator's stop, or a reload changed or removed it: drain, then stop

    @property
    def demand(self) -> bool:
        return self.waiting > 0 or self.wanted


@dataclass(frozen=True)
class Start:
    name: str


@dataclass(frozen=True)
class Drain:
    """No new admissions; it stops once it holds no slot (a later Stop)."""

    name: str
    reason: str  # "evict" (for `to`) | "operator"


@dataclass(frozen=True)
class Undrain:
    """The reason to drain went away (the requests that wanted its room left): admit again."""

    name: str


@dataclass(frozen=True)
class Stop:
    """Stop (or put to sleep) a unit that holds no slot."""

    name: str
    reason: str  # "evict" | "idle" | "operator"
    to: str | None = None  # evict: the unit that gets the room


Action = Start | Drain | Undrain | Stop


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    wake_at: float | None = None  # ask again at this time even if nothing happens

    def wake(self, t: float) -> None:
        if self.wake_at is None or t < self.wake_at:
            self.wake_at = t


def _fits(need: Mapping[str, float], free: Mapping[str, float]) -> bool:
    # a resource nobody declared is unconstrained (config.py refuses `uses` of an undeclared one)
    return all(amount <= free.get(r, float("inf")) + 1e-9 for r, amount in need.items())


def _add(free: dict[str, float], uses: Mapping[str, float], sign: float) -> None:
    for r, amount in uses.items():
        if r in free:
            free[r] += sign * amount


def _free(resources: Mapping[str, float], holders: Iterable[Unit]) -> dict[str, float]:
    free = dict(resources)
    for u in holders:
        _add(free, u.uses, -1)
    return free


def admits(unit: Unit, units: Sequence[Unit], policy: str = "batch") -> bool:
    """Whether `unit` may admit its next request (or a new arrival) now."""
    if unit.state is not UnitState.READY or unit.evict:
        return False
    if policy != "fifo":
        return True
    # strict arrival order: nobody older waits anywhere else
    mine = unit.oldest_wait
    for u in units:
        if u.name == unit.name or not u.waiting or u.oldest_wait is None:
            continue
        if mine is None or u.oldest_wait < mine:
            return False
    return True


def decide(units: Sequence[Unit], resources: Mapping[str, float], now: float, *,
           policy: str = "batch", swap_after_s: float = 20.0) -> Plan:
    """The actions for now. Call it after the queues have admitted what `admits` lets in: a unit
    that has just become ready then holds the slots of its first requests and can be drained,
    not stopped, so every start serves at least one batch (without that order, two backends
    that each had a request waiting could evict each other forever, serving nobody)."""
    plan = Plan()
    swap_after = 0.0 if policy == "fifo" else swap_after_s
    by_name = {u.name: u for u in units}
    free_now = _free(resources, (u for u in units if u.state in HOLDING))

    # Units that will keep their resources unless evicted below: starting (not evictable: it is
    # about to serve what made it start) and ready/draining ones. Stopping ones are on their way out.
    keep: dict[str, Unit] = {}
    stopping_for_good: set[str] = set()
    for u in units:
        if u.state in (UnitState.READY, UnitState.DRAINING):
            if u.evict:
                stopping_for_good.add(u.name)
            elif u.held == 0 and u.waiting == 0 and u.idle_ttl_s is not None:
                due = u.last_used + u.idle_ttl_s
                if now >= due:
                    plan.actions.append(Stop(u.name, "idle"))
                    stopping_for_good.add(u.name)
                    continue
                plan.wake(due)
                keep[u.name] = u
            else:
                keep[u.name] = u
    free_future = _free(resources, (u for u in units if u.state is UnitState.STARTING))
    for u in keep.values():
        _add(free_future, u.uses, -1)

    candidates = []
    for u in units:
        if u.state not in STARTABLE or not u.demand:
            continue
        if u.state is UnitState.FAILED and u.retry_at is not None and now < u.retry_at:
            plan.wake(u.retry_at)
            continue
        candidates.append(u)
    # oldest wait first; between equals, the one served least recently (else the unit just
    # evicted for another, whose queue is as old, would win the room back at once, forever)
    candidates.sort(key=lambda u: (u.oldest_wait if u.oldest_wait is not None else now, u.last_used, u.name))

    victims: dict[str, str] = {}  # victim -> the unit it makes room for
    for c in candidates:
        since = c.oldest_wait if c.oldest_wait is not None else now
        overdue = now >= since + swap_after
        if not _fits(c.uses, free_future):
            eligible = [v for v in keep.values() if v.name not in victims
                        and (v.state is UnitState.DRAINING or v.waiting == 0 or overdue)]
            # decided drains first (a decision sticks), then idle ones, then the least busy, LRU
            eligible.sort(key=lambda v: (v.state is not UnitState.DRAINING, v.held > 0, v.waiting, v.last_used, v.name))
            f = dict(free_future)
            chosen = []
            for v in eligible:
                if _fits(c.uses, f):
                    break
                chosen.append(v)
                _add(f, v.uses, +1)
            if not _fits(c.uses, f):
                if not overdue:
                    plan.wake(since + swap_after)
                if policy == "fifo":
                    break  # nobody overtakes the head of the line
                continue
            for v in chosen:
                victims[v.name] = c.name
                del keep[v.name]
            free_future = f
        _add(free_future, c.uses, -1)  # reserved for c, whether it starts now or once room is made
        if _fits(c.uses, free_now):
            plan.actions.append(Start(c.name))
            _add(free_now, c.uses, -1)
        elif policy == "fifo":
            break

    for name in sorted(stopping_for_good | set(victims)):
        u = by_name[name]
        if any(isinstance(a, Stop) and a.name == name for a in plan.actions):
            continue
        reason = "evict" if name in victims else "operator"
        if u.held == 0:
            plan.actions.append(Stop(name, reason, victims.get(name)))
        elif u.state is UnitState.READY:
            plan.actions.append(Drain(name, reason))
    for u in keep.values():
        if u.state is UnitState.DRAINING:
            plan.actions.append(Undrain(u.name))
    return plan
