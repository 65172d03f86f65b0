"""The fleet's effects, as functions of a unit and what they need: a start (a spawn, or a wake
from sleep), a stop (or a sleep), and noticing a server that exited by itself. `Fleet` (fleet.py)
runs each start or stop in a task of its own and wakes its loop when it is done, so the loop never
blocks on a process.

Processes and probes go through what the fleet was given (`spawner`, `prober`), so that the fleet
is driven in tests without processes (tests/unit/lifecycle/test_fleet.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping, Protocol

from .. import config as cfgmod
from ..errors import GatewayError, clean_message
from .logring import LogRing
from .machine import Aim, Event
from .swap_policy import UnitState
from .process import describe_status
from .unit import Managed, Process

log = logging.getLogger("homelab_frontend.lifecycle")

READY_POLL_S = 0.2
TAIL_LINES = 5  # log lines in a failed start's 503
MAX_BACKOFF_FACTOR = 32
START_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

# Makes the process of a managed backend: (argv, env, cwd, its log) -> a running process.
# argv, env, cwd, the log, and the kill grace should the gateway die (`run.kill_grace_s`)
Spawner = Callable[[list[str], Mapping[str, str], "str | None", LogRing, float], Awaitable[Process]]


class Prober(Protocol):
    """What the effects ask of a managed server over HTTP (probe.Prober; a test's stand-in)."""

    async def ready(self, b: cfgmod.Backend) -> bool: ...
    async def listening(self, b: cfgmod.Backend) -> bool: ...
    async def sleep(self, b: cfgmod.Backend, level: int, timeout_s: float) -> None: ...
    async def wake(self, b: cfgmod.Backend, timeout_s: float) -> None: ...
    async def is_sleeping(self, b: cfgmod.Backend) -> bool | None: ...
    async def close(self) -> None: ...


async def start(u: Managed, was: UnitState, spawner: Spawner, prober: Prober,
                kick: Callable[[], None], counted: Callable[[str, float], None]) -> None:
    """Start `u` (state starting) and move it on: up, or failed with its waiting requests
    answered. `counted(outcome, seconds)` is told how it went before the move (outcome:
    ok|exit|timeout|error|port_in_use); `kick` when the process exits later."""
    t0 = time.monotonic()
    u.error = None
    outcome, err = "ok", None
    try:
        if was is UnitState.SLEEPING and not u.stale and u.child is not None and u.child.running:
            outcome, err = await _wake(u, spawner, prober, kick)
        else:
            outcome, err = await _spawn(u, spawner, prober, kick)
    except asyncio.CancelledError:
        raise
    except OSError as exc:  # exec failed: said as a shell would (127: not found, 126: not runnable)
        u.last_exit = 127 if isinstance(exc, FileNotFoundError) else 126
        outcome, err = "exit", f"cannot run {u.run.argv()[0]!r}: {exc.strerror} ({describe_status(u.last_exit)})"
    except Exception as exc:
        # a bug of the gateway's own, not the backend's: logged with its traceback, and the
        # 503 says so rather than passing it off as the server's failure
        log.exception("lifecycle: internal error while starting backend %s", u.name)
        outcome, err = "error", (f"the gateway hit an internal error while starting it "
                                 f"({type(exc).__name__}: {exc}); see the gateway's log")
        # the server may be running already: a failed unit holds nothing in the policy's
        # eyes, so another backend may be started in its place; its process must go now
        if u.child is not None and u.child.running:
            u.last_exit = await u.child.stop(u.run.stop_timeout_s)
    finally:
        u.effect = None
    took = time.monotonic() - t0
    counted(outcome, took)
    if outcome == "ok":
        u.last_start_s, u.failures, u.retry_at = took, 0, None
        u.last_used = time.monotonic()
        u.advance(Event.UP)
        log.info("backend %s: ready in %.1f s", u.name, took)
    else:
        u.failures += 1
        backoff = u.run.backoff_s * min(MAX_BACKOFF_FACTOR, 2 ** (u.failures - 1))
        u.retry_at = time.monotonic() + backoff
        tail = "" if outcome == "error" else " | ".join(
            line.strip() for line in u.log.tail(TAIL_LINES + 1) if not line.startswith("-- gateway:"))[-1500:]
        u.error = clean_message(f"backend {u.name!r} failed to start: {err}"
                                + (f"; last lines of its log: {tail}" if tail else "")
                                + f" (next try in {backoff:g} s)", limit=2000)
        u.advance(Event.FAIL)
        log.warning("%s", u.error)
        if u.pool is not None:
            u.pool.queue.fail_all(GatewayError("backend_down", u.error, status=503,
                                               retry_after=max(1.0, round(backoff))))


async def _spawn(u: Managed, spawner: Spawner, prober: Prober, kick: Callable[[], None]) -> tuple[str, str | None]:
    run = u.run
    if u.child is not None and u.child.running:  # a sleeping one being replaced: it goes first
        u.last_exit = await u.child.stop(run.stop_timeout_s)
    deadline = time.monotonic() + run.start_timeout_s
    if not await _address_free(u, prober, deadline):
        return "port_in_use", (f"{u.cfg.url} already answers, and not from a server the gateway "
                               f"started: another program (or a server left from an earlier run) "
                               f"holds its port; the readiness probe would have taken it for this "
                               f"backend. Stop it, or give the backend another port")
    u.log.mark(f"-- gateway: starting {' '.join(run.argv())}")
    u.aim(Aim.RESPAWN)  # whatever was to be replaced is: this is the new command
    u.child = child = await spawner(run.argv(), run.env, run.cwd, u.log, run.kill_grace_s)
    child.exited.add_done_callback(lambda _: kick())  # an exit while serving is an event too
    u.log.mark(f"-- gateway: pid {child.pid}")
    while True:
        if not child.running:
            u.last_exit = child.exited.result()
            return "exit", describe_status(u.last_exit)
        if await prober.ready(u.cfg):
            return "ok", None
        if time.monotonic() >= deadline:
            u.last_exit = await child.stop(run.stop_timeout_s)
            return "timeout", f"not ready within {run.start_timeout_s:g} s (stopped: {describe_status(u.last_exit)})"
        try:
            await asyncio.wait_for(asyncio.shield(child.exited), READY_POLL_S)
        except TimeoutError:
            pass


async def _address_free(u: Managed, prober: Prober, deadline: float) -> bool:
    """A server about to be spawned must find its address free: if something else answers
    there, the readiness probe would take that stranger for the new server and route to it.
    What holds it may be on its way out (a previous leader's server that its supervisor is
    killing, a stopped server's last second), so the start waits for it, within its own
    start_timeout_s, before calling it taken."""
    if not await prober.listening(u.cfg):
        return True
    u.log.mark(f"-- gateway: {u.cfg.url} already answers: waiting for it to be free before starting")
    while time.monotonic() < deadline:
        await asyncio.sleep(READY_POLL_S)
        if not await prober.listening(u.cfg):
            return True
    return False


async def _wake(u: Managed, spawner: Spawner, prober: Prober, kick: Callable[[], None]) -> tuple[str, str | None]:
    run = u.run
    try:
        await prober.wake(u.cfg, run.start_timeout_s)
    except Exception as exc:
        u.log.mark(f"-- gateway: wake_up failed: {exc}: starting it afresh")
        return await _spawn(u, spawner, prober, kick)
    deadline = time.monotonic() + run.start_timeout_s
    while time.monotonic() < deadline:
        if u.child is None or not u.child.running:
            u.last_exit = u.child.exited.result() if u.child is not None else None
            return "exit", describe_status(u.last_exit or 0)
        if await prober.is_sleeping(u.cfg) is False and await prober.ready(u.cfg):
            return "ok", None
        await asyncio.sleep(READY_POLL_S)
    return "timeout", f"not awake within {run.start_timeout_s:g} s"


async def stop(u: Managed, prober: Prober) -> None:
    """Stop `u` (state stopping), or put it to sleep (`unload: sleep`), and move it on."""
    run = u.run
    try:
        child = u.child
        if run.unload == "sleep" and not u.stale and child is not None and child.running:
            try:
                await prober.sleep(u.cfg, run.sleep_level, run.stop_timeout_s + 60)
                u.advance(Event.SLEPT)
                return
            except Exception as exc:
                u.log.mark(f"-- gateway: sleep failed: {exc}: stopping it instead")
        if child is not None:
            try:
                u.last_exit = await child.stop(run.stop_timeout_s)
            except Exception:  # a bug of ours: the unit must not stay `stopping` for good
                log.exception("backend %r: the gateway's own error while stopping it; its tree is killed", u.name)
                u.log.mark("-- gateway: internal error while stopping: the whole tree is killed")
                child.kill()
        u.advance(Event.EXITED)
    finally:
        u.aim(Aim.GONE if u.state is UnitState.STOPPED else Aim.SLEPT)
        u.effect = None


def watch_exits(units: dict[str, Managed]) -> None:
    """Notice a server that exits on its own while ready, draining or asleep (a crash, a kill -9)."""
    for u in units.values():
        if (u.effect is None and u.state in (UnitState.READY, UnitState.DRAINING, UnitState.SLEEPING)
                and u.child is not None and not u.child.running):
            u.last_exit = u.child.exited.result()
            u.error = f"backend {u.name!r} exited while {u.state.value}: {describe_status(u.last_exit)}"
            log.warning("%s", u.error)
            u.advance(Event.EXITED)
            u.aim(Aim.GONE)


async def spawn_child(argv: list[str], env: Mapping[str, str], cwd: str | None, ring: LogRing,
                      kill_grace_s: float) -> Process:
    """The real spawner: a `process.Child` (its own process group, never outliving the gateway)."""
    from .process import Child

    return await Child.start(argv, env, cwd, ring, kill_grace_s)
