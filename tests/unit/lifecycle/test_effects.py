"""The fleet's effects on one unit (lifecycle/effects.py), called directly with a scripted child,
spawner and prober in place of process.Child and probe.Prober: a start that comes up, one that
exits, cannot exec, hits a bug of the gateway's own or finds its port taken (each a failure with
its back-off and a 503 that says why), a stop, a sleep, and a server that dies by itself."""

from __future__ import annotations

import asyncio

from homelab_frontend import config as cfgmod
from homelab_frontend.lifecycle import effects
from homelab_frontend.lifecycle.machine import Event
from homelab_frontend.lifecycle.swap_policy import UnitState
from homelab_frontend.lifecycle.unit import Managed
from support.scripted_child import ScriptedChild


class Spawner:
    def __init__(self, exit_at_start: int | None = None, raises: BaseException | None = None,
                 log_line: str | None = None) -> None:
        self.exit_at_start, self.raises, self.log_line = exit_at_start, raises, log_line
        self.calls: list[list[str]] = []
        self.child: ScriptedChild | None = None

    async def __call__(self, argv, env, cwd, ring, kill_grace_s):
        self.calls.append(argv)
        if self.raises is not None:
            raise self.raises
        if self.log_line is not None:
            ring.mark(self.log_line)
        self.child = ScriptedChild(self.exit_at_start)
        return self.child


class Prober:
    def __init__(self, taken: bool = False, sleep_fails: bool = False) -> None:
        self.taken, self.sleep_fails = taken, sleep_fails
        self.slept: list[int] = []

    async def ready(self, cfg) -> bool:
        return True

    async def listening(self, cfg) -> bool:
        return self.taken

    async def sleep(self, cfg, level, timeout_s) -> None:
        if self.sleep_fails:
            raise RuntimeError("sleep endpoint missing")
        self.slept.append(level)


def unit(**run) -> Managed:
    cfg = cfgmod.parse({"backends": {"gpu0": {"url": "http://127.0.0.1:9/v1", "slots": 1, "kind": "vllm", "run": {
        "cmd": ["llama-server", "-m", "x.gguf"], "start_timeout_s": 1, "backoff_s": 2, **run}}},
        "models": {"m": {"backend": "gpu0"}}})
    u = Managed("gpu0", cfg.backends["gpu0"])
    u.advance(Event.START)
    return u


def start(u: Managed, spawner: Spawner, prober: Prober) -> list[str]:
    counted: list[str] = []
    asyncio.run(effects.start(u, UnitState.STOPPED, spawner, prober, lambda: None,
                              lambda outcome, s: counted.append(outcome)))
    return counted


def test_a_start_that_comes_up_is_ready_and_counted_ok():
    async def main() -> None:
        u = unit()
        u.failures = 2
        spawner = Spawner()
        counted = []
        await effects.start(u, UnitState.STOPPED, spawner, Prober(), lambda: None,
                            lambda outcome, s: counted.append(outcome))
        assert counted == ["ok"] and u.state is UnitState.READY
        assert (u.failures, u.retry_at, u.error) == (0, None, None) and u.last_start_s is not None
        assert spawner.calls == [["llama-server", "-m", "x.gguf"]] and u.child is spawner.child
        assert "-- gateway: starting llama-server -m x.gguf" in u.log.tail(5)
        assert f"-- gateway: pid {spawner.child.pid}" in u.log.tail(5)

    asyncio.run(main())


def test_a_server_that_exits_at_start_fails_with_its_status_log_and_back_off():
    u = unit()
    assert start(u, Spawner(exit_at_start=1, log_line="error: model file not found"), Prober()) == ["exit"]
    assert u.state is UnitState.FAILED and u.last_exit == 1 and u.failures == 1 and u.retry_at is not None
    assert u.error.startswith("backend 'gpu0' failed to start: exit status 1; last lines of its log: ")
    assert "error: model file not found" in u.error and "-- gateway:" not in u.error
    assert u.error.endswith("(next try in 2 s)")
    u.advance(Event.START)
    start(u, Spawner(exit_at_start=-9), Prober())
    assert u.failures == 2 and "killed by signal 9 (SIGKILL)" in u.error and u.error.endswith("(next try in 4 s)")


def test_a_command_that_cannot_run_is_said_as_a_shell_would():
    u = unit()
    assert start(u, Spawner(raises=FileNotFoundError(2, "No such file or directory")), Prober()) == ["exit"]
    assert u.last_exit == 127 and u.state is UnitState.FAILED
    assert "cannot run 'llama-server': No such file or directory (exit status 127)" in u.error


def test_a_bug_of_the_gateways_own_is_said_as_one():
    u = unit()
    assert start(u, Spawner(raises=RuntimeError("oops")), Prober()) == ["error"]
    assert u.state is UnitState.FAILED
    assert "the gateway hit an internal error while starting it (RuntimeError: oops)" in u.error
    assert "last lines of its log" not in u.error


def test_an_address_another_program_holds_is_not_taken_for_the_new_server():
    u = unit(start_timeout_s=0.3)
    spawner = Spawner()
    assert start(u, spawner, Prober(taken=True)) == ["port_in_use"]
    assert spawner.calls == [] and u.state is UnitState.FAILED
    assert "<backend> already answers, and not from a server the gateway started" in u.error
    assert "127.0.0.1" not in u.error  # the 503 names no address


def test_a_stop_stops_the_child_and_a_sleep_keeps_it():
    async def main() -> None:
        u = unit()
        await effects.start(u, UnitState.STOPPED, Spawner(), Prober(), lambda: None, lambda *a: None)
        child = u.child
        u.advance(Event.STOP)
        await effects.stop(u, Prober())
        assert u.state is UnitState.STOPPED and child.stops == 1 and u.last_exit == 0

        s = unit(unload="sleep", sleep_level=2)
        await effects.start(s, UnitState.STOPPED, Spawner(), Prober(), lambda: None, lambda *a: None)
        s.advance(Event.STOP)
        prober = Prober()
        await effects.stop(s, prober)
        assert s.state is UnitState.SLEEPING and prober.slept == [2] and s.child.running

        f = unit(unload="sleep")
        await effects.start(f, UnitState.STOPPED, Spawner(), Prober(), lambda: None, lambda *a: None)
        f.advance(Event.STOP)
        await effects.stop(f, Prober(sleep_fails=True))  # cannot sleep: stopped instead
        assert f.state is UnitState.STOPPED and not f.child.running
        assert any("sleep failed: sleep endpoint missing" in line for line in f.log.tail(5))

    asyncio.run(main())


def test_a_server_that_dies_while_ready_is_noticed():
    async def main() -> None:
        u = unit()
        await effects.start(u, UnitState.STOPPED, Spawner(), Prober(), lambda: None, lambda *a: None)
        effects.watch_exits({"gpu0": u})
        assert u.state is UnitState.READY  # still running: nothing to notice
        u.child.kill()
        effects.watch_exits({"gpu0": u})
        assert u.state is UnitState.STOPPED and u.last_exit == -9
        assert u.error == "backend 'gpu0' exited while ready: killed by signal 9 (SIGKILL)"

    asyncio.run(main())
