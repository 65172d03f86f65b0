"""The fleet of managed backends: the policy's decisions performed, and what the operator sees.

One `Fleet` per gateway. It keeps a `Managed` record per backend with `run:` (unit.py), and one
task that loops: snapshot every unit for `swap_policy.decide`, perform its actions, let the queues
admit what the policy admits, sleep until the next event (a change in demand; a server ready or
exited; an operator's ask) or the moment the plan said the answer could change by itself. Every
effect (a spawn, a stop, a probe, a sleep: effects.py) runs in a task of its own and kicks the
loop when it is done, so the loop never blocks on a process. A unit moves only through the table
in machine.py; an illegal move raises.

One class holds the fleet's state; the rooms beside it are functions of a unit (or of the units)
that it calls and then wakes its loop: unit.py (the record and the gate on its queue), machine.py
(the moves, of the state and of the goal), reload.py (a reloaded config against the records),
operator.py (the admin API's asks), following.py (the callbacks of lifecycle/cluster.py),
effects.py (starts, stops, exits), and here the loop.

A change in demand is what the policy could decide otherwise on, against what the last round
saw (`slot_event`): a first request waiting (or the last one gone: granted, expired, left), the
last slot of a unit the round saw busy given back, and under `fifo` a new oldest waiter (another
queue may be first in line now). Every other slot taken or given back moves nothing the policy
reads but the idle clock (`last_used`), which the round planned for anyway: woken early it plans
again, so it is not woken for those (it was, on every one: up to two rounds per request).

Failures: a start that exits, or is not ready within `start_timeout_s` (then it is stopped),
answers its waiting requests at once with a 503 naming the backend, the exit status and the
last lines of its log, and the backend is `failed` for a back-off (`backoff_s`, doubling per
consecutive failure up to 32x) during which new requests get the same 503 with Retry-After.
A bug of the gateway's own in a start is logged with its traceback and its 503 says so.
A server that exits while serving is `stopped`: its streams end with their dialect's error (the
exchange sees the socket close), their slots are freed, and the next request starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable, Coroutine, NamedTuple

from .. import config as cfgmod
from ..admission.slots import SlotStore
from ..errors import GatewayError
from . import effects, following, operator, swap_policy
from .effects import START_BUCKETS, Prober as ProberLike, Spawner, spawn_child
from .keep_alive import Forever
from .machine import BUSY, Event
from .swap_policy import UnitState
from .cluster import Coordinator
from .probe import Prober
from .reload import reconcile
from .unit import Door, Managed

__all__ = ["Fleet", "Managed", "START_BUCKETS"]

log = logging.getLogger("homelab_frontend.lifecycle")


class Demand(NamedTuple):
    """A unit's demand as its slot events can move it (Fleet.slot_event)."""

    waiting: bool  # a request is in its queue
    held: bool  # a slot is held
    oldest: float | None  # when its oldest waiter arrived (fifo only; None otherwise)


IDLE = Demand(False, False, None)


class Fleet:
    def __init__(self, spawner: Spawner = spawn_child, prober: ProberLike | None = None) -> None:
        self.units: dict[str, Managed] = {}
        self.resources: dict[str, float] = {}
        self.policy = "batch"
        self.swap_after_s = 20.0
        self.spawner = spawner  # makes a server's process (effects.spawn_child: a process.Child)
        self.prober: ProberLike = prober if prober is not None else Prober()
        # the gateway's hook on every state change: it probes a backend that became ready at once
        # (kind, context lengths) and never counts one that is not running by design as down
        self.on_change: Callable[[str, UnitState], None] | None = None
        self.coord: Coordinator | None = None  # with `cluster:`: only its leader runs servers
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        # metrics: what happened (read by ops/metrics.py at scrape time)
        self.starts: Counter[tuple[str, str]] = Counter()  # (backend, outcome) outcome: ok|exit|timeout|error
        self.start_buckets: dict[str, list[int]] = {}
        self.start_sum: dict[str, float] = {}
        self.swaps: Counter[str] = Counter()  # backend stopped to make room for another
        self.rounds = 0  # rounds of the loop so far (each one snapshots every unit for the policy)
        self._seen: dict[str, Demand] = {}  # each unit's demand as the last round left it

    # -- configuration ------------------------------------------------------------------------

    def configure(self, cfg: cfgmod.Config) -> None:
        self.resources = dict(cfg.resources)
        self.policy, self.swap_after_s = cfg.lifecycle.policy, cfg.lifecycle.swap_after_s
        reconcile(self.units, cfg, self._changed)
        self.kick()

    def attach(self, name: str, pool: SlotStore) -> None:
        """A backend's slot pool: a managed backend's queue gets its Door (admission follows the
        policy), any other's none (it always admits)."""
        u = self.units.get(name)
        if u is None or u.removed:
            pool.queue.gate = None
            return
        u.pool = pool
        if not isinstance(pool.queue.gate, Door):
            pool.queue.gate = Door(self, name)
        pool.queue.set_loading(u.state is UnitState.STARTING)

    @property
    def load_wait_s(self) -> dict[str, float]:
        """Seconds requests spent waiting for each backend to load (metrics)."""
        return {name: u.pool.queue.load_wait_s for name, u in self.units.items() if u.pool is not None}

    def _changed(self, name: str, state: UnitState) -> None:
        if self.on_change is not None:
            self.on_change(name, state)

    def managed(self, name: str) -> bool:
        u = self.units.get(name)
        return u is not None and not u.removed

    def ready(self, name: str) -> bool:
        u = self.units.get(name)
        return u is not None and u.state is UnitState.READY

    def unavailable(self, name: str) -> str | None:
        """Why a managed backend can serve nothing now, or None. A stopped (or sleeping) one is
        available: a request starts it. One whose start failed (`failed`: backing off, then tried
        again only when a request asks) is not, and says why (what its 503s say)."""
        u = self.units.get(name)
        if u is None or u.removed or u.state is not UnitState.FAILED:
            return None
        return u.error or (u.remote or {}).get("error") or f"backend {name!r} failed to start"

    @property
    def follower(self) -> bool:
        return self.coord is not None and not self.coord.leader

    # -- what a Door asks ---------------------------------------------------------------------

    def admits(self, name: str) -> bool:
        u = self.units.get(name)
        if u is None:
            return True
        views = [m.view() for m in self.units.values()] if self.policy == "fifo" else ()
        return swap_policy.admits(u.view(), views, self.policy)

    def load_eta_s(self, name: str) -> float:
        """How long until `name` admits, as far as its starts tell: its last start's time (its
        start timeout before the first), less what the start under way has already taken."""
        u = self.units.get(name)
        if u is None:
            return 0.0
        usual = u.last_start_s if u.last_start_s is not None else u.run.start_timeout_s
        if u.state is UnitState.STARTING:
            return max(0.0, usual - (time.time() - u.since))
        return usual

    def refusal(self, name: str) -> GatewayError | None:
        u = self.units.get(name)
        if u is None:
            return None
        if u.remote is not None and u.state is UnitState.FAILED and u.remote.get("retry_in_s"):
            return GatewayError("backend_down", u.remote.get("error") or f"backend {name!r} failed to start",
                                status=503, retry_after=max(1.0, float(u.remote["retry_in_s"])))
        if u.removed:
            return GatewayError("backend_down", f"backend {name!r} was removed from the config", retry_after=5)
        if u.state is UnitState.FAILED and u.retry_at is not None:
            left = u.retry_at - time.monotonic()
            if left > 0:
                return GatewayError("backend_down", u.error or f"backend {name!r} failed to start",
                                    status=503, retry_after=max(1.0, round(left)))
        return None

    def kick(self) -> None:
        self._kick.set()

    def slot_event(self, name: str) -> None:
        """A slot of `name` was taken or given back, or a request joined or left its queue (its
        Door): the idle clock restarts; the loop wakes only when the demand moved (module docstring)."""
        u = self.units.get(name)
        if u is None:
            return
        u.last_used = time.monotonic()
        now, seen = self._demand(u), self._seen.get(name, IDLE)
        if now.waiting != seen.waiting or (seen.held and not now.held) or now.oldest != seen.oldest:
            self.kick()

    def _demand(self, u: Managed) -> Demand:
        pool = u.pool
        if pool is None:
            return IDLE
        # only fifo lets one queue's oldest request hold back another queue's admission
        oldest = pool.queue.oldest_wait() if self.policy == "fifo" else None
        return Demand(pool.queue.queued > 0, pool.in_use > 0, oldest)

    def _saw(self) -> None:
        self._seen = {name: self._demand(u) for name, u in self.units.items()}

    # -- what the operator asks (operator.py) -------------------------------------------------

    def want(self, name: str) -> dict[str, Any]:
        u = self.units[name]
        operator.want(u)
        self.kick()
        return u.as_dict()

    def unwant(self, name: str) -> dict[str, Any]:
        u = self.units[name]
        operator.unwant(u)
        self.kick()
        return u.as_dict()

    def keep_alive(self, name: str, asked: float | Forever, *, prompt: bool = True) -> None:
        """A client's `keep_alive` (operator.keep_alive)."""
        u = self.units.get(name)
        if u is not None and operator.keep_alive(u, asked, prompt=prompt):
            self.kick()

    def snapshot(self) -> list[dict[str, Any]]:
        return operator.snapshot(self.units, self.coord)

    # -- the Coordinator's callbacks (following.py) -------------------------------------------

    def mirror(self, states: dict[str, Any]) -> None:
        following.mirror(self.units, states)
        self.kick()

    def became_leader(self) -> None:
        following.became_leader(self.units)
        self.kick()

    def lost_leadership(self) -> None:
        following.lost_leadership(self.units)
        self.kick()

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None and self.units:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
            if self.coord is not None:
                self.coord.start(self)
        self.kick()

    async def _run(self) -> None:
        while not self._closing:
            self._kick.clear()
            try:
                wake_at = self.step()
            except Exception:  # a bug must not silently end every managed backend's life cycle
                log.exception("lifecycle: a round failed; trying again in a second")
                wake_at = time.monotonic() + 1.0
            timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic()) + 0.01
            try:
                await asyncio.wait_for(self._kick.wait(), timeout)
            except TimeoutError:
                pass

    def step(self) -> float | None:
        """One round: decide, perform, admit. -> when to look again without an event."""
        self.rounds += 1
        if self.follower:
            self._grant()  # the leader decides; here the queues follow its published states
            self._saw()
            return None
        effects.watch_exits(self.units)
        for name, u in list(self.units.items()):
            if u.state in BUSY:
                continue
            if u.state is UnitState.SLEEPING and u.stale:  # a sleeping process of a changed or removed backend
                self._effect(u, Event.STOP, self._stop(u))
            elif u.removed and u.state not in swap_policy.HOLDING:
                del self.units[name]
                if u.pool is not None:
                    u.pool.queue.fail_all(GatewayError("backend_down", f"backend {name!r} was removed from the config"))
                    u.pool.queue.gate = None
        self._grant()  # what may be admitted is, first: a unit just ready serves before it is judged
        now = time.monotonic()
        wants = self.coord.remote_wants if self.coord is not None else {}
        used = self.coord.remote_used if self.coord is not None else {}
        views = [u.view(wants.get(u.name), used.get(u.name, 0.0)) for u in self.units.values()]
        plan = swap_policy.decide(views, self.resources, now, policy=self.policy, swap_after_s=self.swap_after_s)
        for a in plan.actions:
            self._perform(a)
        self._grant()
        self._saw()
        return plan.wake_at

    def _grant(self) -> None:
        for u in self.units.values():
            if u.pool is not None:
                u.pool.grant()

    def _perform(self, a: swap_policy.Action) -> None:
        u = self.units[a.name]
        if isinstance(a, swap_policy.Start):
            if u.state in BUSY or u.removed:
                return
            u.wanted_at = None
            was = u.state
            # at once: the next round must see it holding its resources
            self._effect(u, Event.START, self._start(u, was))
        elif isinstance(a, swap_policy.Drain):
            if u.state is UnitState.READY:
                u.advance(Event.DRAIN)
        elif isinstance(a, swap_policy.Undrain):
            if u.state is UnitState.DRAINING:
                u.advance(Event.UNDRAIN)
        elif isinstance(a, swap_policy.Stop):
            if u.state in BUSY or (u.pool is not None and u.pool.in_use):
                return
            if a.reason == "evict":
                self.swaps[u.name] += 1
                log.info("backend %s: stopping to make room for %s", u.name, a.to)
            elif a.reason == "idle":
                log.info("backend %s: idle for %g s: stopping", u.name, u.idle_ttl_s)
            self._effect(u, Event.STOP, self._stop(u))

    def _effect(self, u: Managed, event: Event, coro: Coroutine[Any, Any, None]) -> None:
        """Move `u` (starting or stopping) and run the effect that ends the move in a task."""
        try:
            u.advance(event)
        except BaseException:
            coro.close()
            raise
        u.effect = asyncio.get_running_loop().create_task(coro)

    async def _start(self, u: Managed, was: UnitState) -> None:
        await effects.start(u, was, self.spawner, self.prober, self.kick,
                            lambda outcome, took: self._counted(u.name, outcome, took))
        self.kick()

    async def _stop(self, u: Managed) -> None:
        try:
            await effects.stop(u, self.prober)
        finally:
            self.kick()

    def _counted(self, name: str, outcome: str, took: float) -> None:
        self.starts[(name, outcome)] += 1
        if outcome != "ok":
            return
        buckets = self.start_buckets.setdefault(name, [0] * len(START_BUCKETS))
        for i, bound in enumerate(START_BUCKETS):
            if took <= bound:
                buckets[i] += 1
        self.start_sum[name] = self.start_sum.get(name, 0.0) + took

    # -- shutdown -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every child (one SIGTERM each, SIGKILL after its stop timeout), concurrently."""
        self._closing = True
        self._kick.set()
        busy = [u.effect for u in self.units.values() if u.effect is not None]
        if self._loop_task is not None:
            self._loop_task.cancel()
            busy.append(self._loop_task)
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        stops = [u.child.stop(u.run.stop_timeout_s) for u in self.units.values()
                 if u.child is not None and u.child.running]
        await asyncio.gather(*stops, return_exceptions=True)
        for u in self.units.values():
            if u.child is not None:
                u.child.close_pipe()
            u.advance(Event.ABANDON)
        await self.prober.close()
        if self.coord is not None:
            await self.coord.close()
