"""The health-probe scheduler: one loop per backend (a peer box's backends are read by its peer's
loop), probes kicked by a request that could not connect, and the running count re-read while a
slot is held. What one probe concludes is ops/health.py's; when to ask is this module's.

Late is not gone. A probe that gets no answer within its timeout (`min(5, health_interval_s)`)
is late, not down: a server answering slowly (a CPU-bound llama-server on a busy host, a vLLM
API server between two scheduler steps, a peer box under load) is still serving the streams it
holds, and taking it out of the routes would fail the requests waiting for it. A backend is
marked down only after `health.LATE_PROBES` late probes in a row (the threshold Kubernetes and
HAProxy default to), or at once when its connection is refused or reset (nothing listens: the
process is gone). Its own requests still mark it down sooner when they cannot connect
(policy/passive_health.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Protocol

from .. import config as cfgmod
from ..ops import health
from ..policy.routing import BackendState, Router
from ..upstream.client import UpstreamClient
from . import peers

log = logging.getLogger("homelab_frontend")


class Gateway(Protocol):
    """What of the gateway (app/gateway.py) the probes read and write."""

    cfg: cfgmod.Config
    backends: dict[str, BackendState]
    clients: dict[str, UpstreamClient]
    router: Router

    def peer_child(self, name: str) -> bool: ...
    def down_by_design(self, name: str) -> bool: ...
    def drop_if_idle(self, name: str) -> bool: ...


class Probes:
    """The probe tasks of one gateway's backends."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._kicked: dict[str, asyncio.Task[None]] = {}
        self._reading: dict[str, asyncio.Task[None]] = {}  # a read of a backend's running count in flight
        self._wake: dict[str, asyncio.Event] = {}  # set when its requests mark a backend down
        self._late: dict[str, int] = {}  # late probes in a row, per backend

    def start(self) -> None:
        """A loop for each backend the config names (after a reload too); a removed one's ends."""
        gw = self.gw
        for name in list(self._loops):
            if name not in gw.backends:
                self._loops.pop(name).cancel()
        for name in gw.backends:
            if gw.peer_child(name):
                continue  # its peer's probe reads it
            if name not in self._loops or self._loops[name].done():
                self._loops[name] = asyncio.get_running_loop().create_task(self._loop(name))

    def kick(self, name: str) -> None:
        """Probe now (once at a time): a failed connect marks the backend down only when the
        probe agrees, so one dropped keep-alive connection cannot take a backend out. Not for a
        backend its requests marked down: its re-probes back off (policy/passive_health.py)."""
        gw = self.gw
        if gw.peer_child(name):
            name = gw.backends[name].peer.parent  # type: ignore[union-attr]  # its peer reads it
        task = self._kicked.get(name)
        state = gw.backends.get(name)
        if state is None or (not state.up and state.passive.suspect):
            return
        if task is None or task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a gateway observed outside one, in unit tests): nothing runs probes
            self._kicked[name] = loop.create_task(self.probe(name))

    async def probe(self, name: str) -> None:
        gw = self.gw
        state = gw.backends.get(name)
        client = gw.clients.get(name)
        if state is None or client is None:
            return
        late = self._late.get(name, 0)
        doc = await health.probe(state, client, late_allowed=late + 1 < health.LATE_PROBES)
        if gw.down_by_design(name):  # stopped (or stopping) while the probe ran
            return
        if doc is health.LATE:
            self._late[name] = late + 1
            return  # nothing learned: the backend (and a peer's report) stays as it was
        if late and state.up:
            log.warning("backend %s answered its probe again after %d late", name, late)
        self._late.pop(name, None)
        state.passive.probed(state.up)
        if state.cfg.kind == "peer" and name in gw.cfg.backends:
            self._peer_report(state, doc)

    def _peer_report(self, state: BackendState, doc: object) -> None:
        """A peer's models list (or its silence): its backends here follow it (app/peers.py)."""
        gw = self.gw
        peers.note_poll(state)
        if not state.up:
            peers.mark_down(state, gw.backends)
            return
        if peers.reconcile(state, doc, gw.backends, gw.clients, gw.drop_if_idle):
            gw.router = Router(gw.cfg, gw.backends)

    def marked_down(self, state: BackendState) -> None:
        """Its requests marked a backend down (policy/passive_health.py): its loop re-plans its
        next probe, soon, instead of a whole health interval on."""
        log.warning("marked down: %s", state.last_error)  # last_error names the backend
        wake = self._wake.get(state.name)
        if wake is not None:
            wake.set()

    def _interval(self, state: BackendState) -> float:
        if not state.up and state.passive.suspect:
            return state.passive.next_probe_s(state.cfg.health_interval_s)
        return state.cfg.health_interval_s

    async def _loop(self, name: str) -> None:
        gw = self.gw
        while name in gw.backends:
            if name not in gw.cfg.backends:  # removed by a reload while still busy
                if gw.drop_if_idle(name):
                    self._late.pop(name, None)
                    return
                await asyncio.sleep(0.5)
                continue
            if gw.down_by_design(name):
                self._late.pop(name, None)
                await asyncio.sleep(0.5)
                continue
            wake = self._wake.setdefault(name, asyncio.Event())
            wake.clear()  # a mark-down from here on re-plans the wait after this probe
            await self.probe(name)
            await self._until_next(name, wake)

    async def _until_next(self, name: str, wake: asyncio.Event) -> None:
        """One health interval (or, for a backend its requests marked down, the passive-health
        backoff: re-planned when `wake` says they just did); meanwhile, while a slot there is
        held, the backend's own running count is re-read every `health.HELD_REFRESH_S`."""
        state = self.gw.backends.get(name)
        if state is None:
            await asyncio.sleep(1)
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + self._interval(state)
        while (left := end - loop.time()) > 0:
            step = min(left, health.HELD_REFRESH_S) if state.up and health.reads_running(state) else left
            try:
                await asyncio.wait_for(wake.wait(), step)
            except TimeoutError:
                pass
            else:
                wake.clear()
                end = loop.time() + self._interval(state)
                continue
            if state.up and state.pool.in_use and health.reads_running(state) and end - loop.time() > step / 4:
                await self.read_running(name)

    async def refresh_running(self) -> None:
        """Re-read the running count of every backend (up) that tells it, for `/admin/requests`."""
        gw = self.gw
        names = [n for n, b in gw.backends.items() if b.up and health.reads_running(b) and n in gw.clients]
        if names:
            await asyncio.gather(*(self.read_running(n) for n in names))

    def read_running(self, name: str) -> Awaitable[None]:
        """At most one read per backend in flight, whoever asks (dashboards poll every second)."""
        task = self._reading.get(name)
        if task is None or task.done():
            state, client = self.gw.backends[name], self.gw.clients[name]
            task = self._reading[name] = asyncio.get_running_loop().create_task(
                health.leak_check(state, client, timeout_s=1.0))
        return asyncio.shield(task)  # an admin request that goes away does not cancel the read

    def close(self) -> None:
        for task in [*self._loops.values(), *self._kicked.values(), *self._reading.values()]:
            task.cancel()
