"""The fleet of managed backends: the policy's decisions performed, and what the operator sees.

One `Fleet` per gateway. It keeps a `Managed` record per backend with `run:`, and one task
that loops: snapshot every unit for `policy.decide`, perform its actions, let the queues admit
what the policy admits, sleep until the next event (a request waiting, leaving or ending; a
server ready or exited) or the moment the plan said the answer could change by itself. Every
effect (a spawn, a stop, a probe, a sleep) runs in a task of its own and kicks the loop when it
is done, so the loop never blocks on a process.

Failures: a start that exits, or is not ready within `start_timeout_s` (then it is stopped),
answers its waiting requests at once with a 503 naming the backend, the exit status and the
last lines of its log, and the backend is `failed` for a back-off (`backoff_s`, doubling per
consecutive failure up to 32x) during which new requests get the same 503 with Retry-After.
A server that exits while serving is `stopped`: its streams end with their dialect's error (the
exchange sees the socket close), their slots are freed, and the next request starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable

from .. import config as cfgmod
from ..errors import GatewayError, clean_message
from . import policy
from ..admission.slots import SlotStore
from .logring import LogRing
from .policy import State
from .probe import Prober
from .process import Child, describe_status

log = logging.getLogger("homelab_frontend.lifecycle")

READY_POLL_S = 0.2
TAIL_LINES = 5  # log lines in a failed start's 503
MAX_BACKOFF_FACTOR = 32
START_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class Managed:
    """One managed backend's live record."""

    def __init__(self, name: str, cfg: cfgmod.Backend, on_change: Callable[[str, State], None] | None = None) -> None:
        self.name = name
        self.on_change = on_change
        self.cfg = cfg
        self.state = State.STOPPED
        self.since = time.time()
        self.pool: SlotStore | None = None  # the backend's slot pool; its queue's gate is a Door
        self.child: Child | None = None
        self.log = LogRing()
        self.last_used = time.monotonic()
        self.last_exit: int | None = None
        self.last_start_s: float | None = None
        self.error: str | None = None  # the last failure, as its 503 said it
        self.failures = 0  # consecutive failed starts
        self.retry_at: float | None = None
        self.wanted_at: float | None = None  # preload / operator's start
        self.evict = False  # operator's stop, or `run` changed / removed by a reload: drain, stop
        self.stale = False  # `run` changed: the process must go (a sleep will not do)
        self.removed = False
        self.busy: asyncio.Task | None = None  # the start or stop in progress
        self.remote: dict | None = None  # a follower's mirror of the leader's record (lifecycle/cluster.py)
        # A client's keep_alive (Ollama's API) in place of run.idle_ttl_s: (seconds or None: never)
        self.keep_alive: tuple[float | None] | None = None

    @property
    def run(self) -> cfgmod.Run:
        assert self.cfg.run is not None
        return self.cfg.run

    def set(self, state: State) -> None:
        if state is not self.state:
            log.info("backend %s: %s -> %s", self.name, self.state.value, state.value)
            self.state, self.since = state, time.time()
            self.log.mark(f"-- gateway: {state.value}")
            if self.on_change is not None:
                self.on_change(self.name, state)

    def view(self, remote_want: tuple[int, float | None] | None = None, remote_used: float = 0.0) -> policy.Unit:
        pool = self.pool
        waiting = pool.queue.queued if pool is not None else 0
        oldest = pool.queue.oldest_wait() if pool is not None else None
        if remote_want is not None and remote_want[1] is not None:  # other replicas' waiting requests
            waiting += remote_want[0]
            oldest = remote_want[1] if oldest is None else min(oldest, remote_want[1])
        if self.wanted_at is not None:
            oldest = self.wanted_at if oldest is None else min(oldest, self.wanted_at)
        return policy.Unit(
            name=self.name, state=self.state, uses=self.run.uses,
            held=pool.in_use if pool is not None else 0, waiting=waiting, oldest_wait=oldest,
            last_used=max(self.last_used, remote_used), idle_ttl_s=self.idle_ttl_s, retry_at=self.retry_at,
            wanted=self.wanted_at is not None, evict=self.evict,
        )

    @property
    def idle_ttl_s(self) -> float | None:
        return self.keep_alive[0] if self.keep_alive is not None else self.run.idle_ttl_s

    def as_dict(self) -> dict:
        if self.remote is not None:  # a follower: the leader's word, and where it runs
            return {**self.remote, "name": self.name, "managed": True, "state": self.state.value,
                    "in_use": self.pool.in_use if self.pool is not None else 0,
                    "waiting": self.pool.queue.queued if self.pool is not None else 0}
        return {
            "name": self.name, "managed": True, "state": self.state.value, "since": self.since,
            "pid": self.child.pid if self.child is not None and self.child.running else None,
            "last_exit_status": self.last_exit,
            "last_exit": describe_status(self.last_exit) if self.last_exit is not None else None,
            "last_start_s": round(self.last_start_s, 3) if self.last_start_s is not None else None,
            "error": self.error, "uses": dict(self.run.uses), "unload": self.run.unload,
            "idle_ttl_s": self.idle_ttl_s,
            "in_use": self.pool.in_use if self.pool is not None else 0,
            "waiting": self.pool.queue.queued if self.pool is not None else 0,
            "retry_in_s": round(max(0.0, self.retry_at - time.monotonic()), 1) if self.retry_at else None,
        }


class Door:
    """The gate (admission.slots.Gate) on a managed backend's queue: it admits what the policy
    admits, refuses at once during a failed start's back-off, and tells the fleet of every change
    in demand or use."""

    __slots__ = ("fleet", "name")

    def __init__(self, fleet: "Fleet", name: str) -> None:
        self.fleet = fleet
        self.name = name

    def admits(self) -> bool:
        return self.fleet.admits(self.name)

    def refusal(self) -> GatewayError | None:
        return self.fleet.refusal(self.name)

    def changed(self) -> None:
        self.fleet.touched(self.name)
        self.fleet.kick()

    def load_s(self) -> float:
        return self.fleet.load_eta_s(self.name)


class Fleet:
    def __init__(self) -> None:
        self.units: dict[str, Managed] = {}
        self.resources: dict[str, float] = {}
        self.policy = "batch"
        self.swap_after_s = 20.0
        self.prober = Prober()
        # the gateway's hook on every state change: it probes a backend that became ready at once
        # (kind, context lengths) and never counts one that is not running by design as down
        self.on_change: Callable[[str, State], None] | None = None
        self.coord: Any = None  # lifecycle.cluster.Coordinator with `cluster:`: only its leader runs servers
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._closing = False
        # metrics: what happened (read by ops/metrics.py at scrape time)
        self.starts: Counter[tuple[str, str]] = Counter()  # (backend, outcome) outcome: ok|exit|timeout|error
        self.start_buckets: dict[str, list[int]] = {}
        self.start_sum: dict[str, float] = {}
        self.swaps: Counter[str] = Counter()  # backend stopped to make room for another

    # -- configuration ------------------------------------------------------------------------

    def configure(self, cfg: cfgmod.Config) -> None:
        self.resources = dict(cfg.resources)
        self.policy, self.swap_after_s = cfg.lifecycle.policy, cfg.lifecycle.swap_after_s
        for name, b in cfg.backends.items():
            if b.run is None:
                continue
            u = self.units.get(name)
            if u is None:
                u = self.units[name] = Managed(name, b, self._changed)
                if b.run.preload:
                    u.wanted_at = time.monotonic()
                continue
            if u.removed:
                u.removed = False
            if b.run != u.cfg.run or b.url != u.cfg.url:
                if u.state in policy.HOLDING or u.state is State.SLEEPING:
                    log.info("backend %s: run changed: restarting once its requests are done", name)
                    u.evict = u.stale = True  # drains, stops; starts again with the new cmd when asked
                u.failures, u.retry_at = 0, None
            u.cfg = b
        for name, u in self.units.items():
            b = cfg.backends.get(name)
            if b is None or b.run is None:
                u.removed = u.evict = u.stale = True
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
        pool.queue.set_loading(u.state is State.STARTING)

    @property
    def load_wait_s(self) -> dict[str, float]:
        """Seconds requests spent waiting for each backend to load (metrics)."""
        return {name: u.pool.queue.load_wait_s for name, u in self.units.items() if u.pool is not None}

    def _changed(self, name: str, state: State) -> None:
        if self.on_change is not None:
            self.on_change(name, state)

    def managed(self, name: str) -> bool:
        u = self.units.get(name)
        return u is not None and not u.removed

    def ready(self, name: str) -> bool:
        u = self.units.get(name)
        return u is not None and u.state is State.READY

    # -- what a Door asks ---------------------------------------------------------------------

    def admits(self, name: str) -> bool:
        u = self.units.get(name)
        if u is None:
            return True
        if u.state is not State.READY or u.evict:
            return False  # policy.admits says the same; asked first, as the cheap common answer
        views = [m.view() for m in self.units.values()] if self.policy == "fifo" else ()
        return policy.admits(u.view(), views, self.policy)

    def load_eta_s(self, name: str) -> float:
        """How long until `name` admits, as far as its starts tell: its last start's time (its
        start timeout before the first), less what the start under way has already taken."""
        u = self.units.get(name)
        if u is None:
            return 0.0
        usual = u.last_start_s if u.last_start_s is not None else u.run.start_timeout_s
        if u.state is State.STARTING:
            return max(0.0, usual - (time.time() - u.since))
        return usual

    @property
    def follower(self) -> bool:
        return self.coord is not None and not self.coord.leader

    def refusal(self, name: str) -> GatewayError | None:
        u = self.units.get(name)
        if u is None:
            return None
        if u.remote is not None and u.state is State.FAILED and u.remote.get("retry_in_s"):
            return GatewayError("backend_down", u.remote.get("error") or f"backend {name!r} failed to start",
                                status=503, retry_after=max(1.0, float(u.remote["retry_in_s"])))
        if u.removed:
            return GatewayError("backend_down", f"backend {name!r} was removed from the config", retry_after=5)
        if u.state is State.FAILED and u.retry_at is not None:
            left = u.retry_at - time.monotonic()
            if left > 0:
                return GatewayError("backend_down", u.error or f"backend {name!r} failed to start",
                                    status=503, retry_after=max(1.0, round(left)))
        return None

    def kick(self) -> None:
        self._kick.set()

    def touched(self, name: str) -> None:
        u = self.units.get(name)
        if u is not None:
            u.last_used = time.monotonic()

    # -- operator -----------------------------------------------------------------------------

    def want(self, name: str) -> dict:
        u = self.units[name]
        u.evict = False
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
            u.evict = True
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

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None and self.units:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
            if self.coord is not None:
                self.coord.start(self)
        self.kick()

    # -- cluster (lifecycle/cluster.py) -------------------------------------------------------

    def mirror(self, states: dict[str, dict]) -> None:
        """A follower: the leader's states are this replica's view of its backends."""
        for name, u in self.units.items():
            doc = states.get(name)
            u.remote = doc if isinstance(doc, dict) else {}
            try:
                state = State(u.remote.get("state", "stopped"))
            except ValueError:
                state = State.STOPPED
            u.set(state)
            self._loading_changed(u)
        self.kick()

    def became_leader(self) -> None:
        for u in self.units.values():
            u.remote = None
            u.set(State.STOPPED)  # the old leader's servers died with it (or were stopped by it)
            if u.run.preload:
                u.wanted_at = time.monotonic()
            self._loading_changed(u)
        self.kick()

    def lost_leadership(self) -> None:
        """Another replica may start these servers now: ours go at once."""
        for u in self.units.values():
            if u.busy is not None:
                u.busy.cancel()
                u.busy = None
            if u.child is not None and u.child.running:
                u.child.kill()
            u.set(State.STOPPED)
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
        if self.follower:
            self._grant()  # the leader decides; here the queues follow its published states
            return None
        self.watch_exits()
        for name, u in list(self.units.items()):
            if u.busy is not None:
                continue
            if u.state is State.SLEEPING and u.stale:  # a sleeping process of a changed or removed backend
                u.set(State.STOPPING)
                u.busy = asyncio.get_running_loop().create_task(self._stop(u, "reload"))
            elif u.removed and u.state not in policy.HOLDING:
                del self.units[name]
                if u.pool is not None:
                    u.pool.queue.fail_all(GatewayError("backend_down", f"backend {name!r} was removed from the config"))
                    u.pool.queue.gate = None
        self._grant()  # what may be admitted is, first: a unit just ready serves before it is judged
        now = time.monotonic()
        wants = self.coord.remote_wants if self.coord is not None else {}
        used = self.coord.remote_used if self.coord is not None else {}
        views = [u.view(wants.get(u.name), used.get(u.name, 0.0)) for u in self.units.values()]
        plan = policy.decide(views, self.resources, now, policy=self.policy, swap_after_s=self.swap_after_s)
        for a in plan.actions:
            self._perform(a)
        self._grant()
        return plan.wake_at

    def _grant(self) -> None:
        for u in self.units.values():
            if u.pool is not None:
                u.pool.grant()

    def _perform(self, a: policy.Action) -> None:
        u = self.units[a.name]
        if isinstance(a, policy.Start):
            if u.busy is not None or u.removed:
                return
            u.wanted_at = None
            was = u.state
            u.set(State.STARTING)  # at once: the next round must see it holding its resources
            u.busy = asyncio.get_running_loop().create_task(self._start(u, was))
        elif isinstance(a, policy.Drain):
            if u.state is State.READY:
                u.set(State.DRAINING)
        elif isinstance(a, policy.Undrain):
            if u.state is State.DRAINING:
                u.set(State.READY)
        elif isinstance(a, policy.Stop):
            if u.busy is not None or (u.pool is not None and u.pool.in_use):
                return
            if a.reason == "evict":
                self.swaps[u.name] += 1
                log.info("backend %s: stopping to make room for %s", u.name, a.to)
            elif a.reason == "idle":
                log.info("backend %s: idle for %g s: stopping", u.name, u.run.idle_ttl_s)
            u.set(State.STOPPING)
            u.busy = asyncio.get_running_loop().create_task(self._stop(u, a.reason))

    # -- effects ------------------------------------------------------------------------------

    async def _start(self, u: Managed, was: State) -> None:
        t0 = time.monotonic()
        u.error = None
        self._loading_changed(u)
        outcome, err = "ok", None
        try:
            if was is State.SLEEPING and not u.stale and u.child is not None and u.child.running:
                outcome, err = await self._wake(u)
            else:
                outcome, err = await self._spawn(u)
        except asyncio.CancelledError:
            raise
        except OSError as exc:  # exec failed: said as a shell would (127: not found, 126: not runnable)
            u.last_exit = 127 if isinstance(exc, FileNotFoundError) else 126
            outcome, err = "exit", f"cannot run {u.run.argv()[0]!r}: {exc.strerror} ({describe_status(u.last_exit)})"
        except Exception as exc:  # a bug of ours: said, not raised
            outcome, err = "error", f"cannot start: {exc}"
        finally:
            u.busy = None
        took = time.monotonic() - t0
        self.starts[(u.name, outcome)] += 1
        if outcome == "ok":
            self._observe_start(u.name, took)
            u.last_start_s, u.failures, u.retry_at = took, 0, None
            u.last_used = time.monotonic()
            u.set(State.READY)
            log.info("backend %s: ready in %.1f s", u.name, took)
        else:
            u.failures += 1
            backoff = u.run.backoff_s * min(MAX_BACKOFF_FACTOR, 2 ** (u.failures - 1))
            u.retry_at = time.monotonic() + backoff
            tail = " | ".join(line.strip() for line in u.log.tail(TAIL_LINES + 1)
                              if not line.startswith("-- gateway:"))[-1500:]
            u.error = clean_message(f"backend {u.name!r} failed to start: {err}"
                                    + (f"; last lines of its log: {tail}" if tail else "")
                                    + f" (next try in {backoff:g} s)", limit=2000)
            u.set(State.FAILED)
            log.warning("%s", u.error)
            if u.pool is not None:
                u.pool.queue.fail_all(GatewayError("backend_down", u.error, status=503,
                                                   retry_after=max(1.0, round(backoff))))
        self._loading_changed(u)
        self.kick()

    async def _spawn(self, u: Managed) -> tuple[str, str | None]:
        run = u.run
        if u.child is not None and u.child.running:  # a sleeping one being replaced: it goes first
            u.last_exit = await u.child.stop(run.stop_timeout_s)
        u.log.mark(f"-- gateway: starting {' '.join(run.argv())}")
        u.stale = False
        u.child = child = Child(run.argv(), run.env, run.cwd, u.log)
        child.exited.add_done_callback(lambda _: self.kick())  # an exit while serving is an event too
        u.log.mark(f"-- gateway: pid {child.pid}")
        deadline = time.monotonic() + run.start_timeout_s
        while True:
            if not child.running:
                u.last_exit = child.exited.result()
                return "exit", describe_status(u.last_exit)
            if await self.prober.ready(u.cfg):
                return "ok", None
            if time.monotonic() >= deadline:
                u.last_exit = await child.stop(run.stop_timeout_s)
                return "timeout", f"not ready within {run.start_timeout_s:g} s (stopped: {describe_status(u.last_exit)})"
            try:
                await asyncio.wait_for(asyncio.shield(child.exited), READY_POLL_S)
            except TimeoutError:
                pass

    async def _wake(self, u: Managed) -> tuple[str, str | None]:
        run = u.run
        try:
            await self.prober.wake(u.cfg, run.start_timeout_s)
        except Exception as exc:
            u.log.mark(f"-- gateway: wake_up failed: {exc}: starting it afresh")
            return await self._spawn(u)
        deadline = time.monotonic() + run.start_timeout_s
        while time.monotonic() < deadline:
            if u.child is None or not u.child.running:
                u.last_exit = u.child.exited.result() if u.child is not None else None
                return "exit", describe_status(u.last_exit or 0)
            if await self.prober.is_sleeping(u.cfg) is False and await self.prober.ready(u.cfg):
                return "ok", None
            await asyncio.sleep(READY_POLL_S)
        return "timeout", f"not awake within {run.start_timeout_s:g} s"

    async def _stop(self, u: Managed, reason: str) -> None:
        run = u.run
        try:
            child = u.child
            if run.unload == "sleep" and not u.stale and child is not None and child.running:
                try:
                    await self.prober.sleep(u.cfg, run.sleep_level, run.stop_timeout_s + 60)
                    u.set(State.SLEEPING)
                    return
                except Exception as exc:
                    u.log.mark(f"-- gateway: sleep failed: {exc}: stopping it instead")
            if child is not None:
                u.last_exit = await child.stop(run.stop_timeout_s)
            u.set(State.STOPPED)
        finally:
            u.evict = False
            u.busy = None
            self.kick()

    def _loading_changed(self, u: Managed) -> None:
        if u.pool is not None:
            u.pool.queue.set_loading(u.state is State.STARTING)

    def _observe_start(self, name: str, took: float) -> None:
        buckets = self.start_buckets.setdefault(name, [0] * len(START_BUCKETS))
        for i, bound in enumerate(START_BUCKETS):
            if took <= bound:
                buckets[i] += 1
        self.start_sum[name] = self.start_sum.get(name, 0.0) + took

    def watch_exits(self) -> None:
        """Notice a server that exits on its own while ready or draining (a crash, a kill -9)."""
        for u in self.units.values():
            if (u.busy is None and u.state in (State.READY, State.DRAINING, State.SLEEPING)
                    and u.child is not None and not u.child.running):
                u.last_exit = u.child.exited.result()
                u.error = f"backend {u.name!r} exited while {u.state.value}: {describe_status(u.last_exit)}"
                log.warning("%s", u.error)
                u.set(State.STOPPED)
                u.evict = False

    # -- shutdown -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every child (one SIGTERM each, SIGKILL after its stop timeout), concurrently."""
        self._closing = True
        self._kick.set()
        busy = [u.busy for u in self.units.values() if u.busy is not None]
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
            if u.state is not State.STOPPED:
                u.set(State.STOPPED)
        await self.prober.close()
        if self.coord is not None:
            await self.coord.close()
