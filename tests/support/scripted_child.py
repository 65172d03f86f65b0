"""A scripted stand-in for lifecycle.process.Child, for the fleet's unit tests that run without
processes (tests/unit/lifecycle/test_effects.py, test_fleet.py): it exits when told (`die`), at
its start if scripted to, or when stopped, and counts its stops."""

from __future__ import annotations

import asyncio
import itertools


class ScriptedChild:
    pids = itertools.count(1000)

    def __init__(self, exit_at_start: int | None = None) -> None:
        self.pid = next(self.pids)
        self.exited: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stops = 0
        if exit_at_start is not None:
            self.exited.set_result(exit_at_start)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def die(self, status: int = -9) -> None:
        if not self.exited.done():
            self.exited.set_result(status)

    async def stop(self, timeout_s: float) -> int:
        self.stops += 1
        self.die(0)
        return 0

    def kill(self) -> None:
        self.die(-9)

    def close_pipe(self) -> None:
        pass
