"""The supervisor's process handling with real (tiny) processes: its own process group, one
SIGTERM then SIGKILL, the parent-death signal, exit statuses, the log pipe."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

from homelab_frontend.lifecycle.logring import LogRing
from homelab_frontend.lifecycle.process import Child, describe_status

# counts the SIGTERMs it gets and never exits on them (llama-server after a second one does not)
STUBBORN = textwrap.dedent("""
    import signal, sys, time
    n = 0
    def on_term(*_):
        global n
        n += 1
        print(f"SIGTERM {n}", flush=True)
    signal.signal(signal.SIGTERM, on_term)
    print("up", flush=True)
    while True:
        time.sleep(0.05)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run(coro):
    return asyncio.run(coro)


def test_exit_status_and_output_reach_the_ring():
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", "import sys; print('hello'); sys.stderr.write('oops\\n'); sys.exit(3)"],
                      {}, None, ring)
        code = await child.exited
        await asyncio.sleep(0.1)
        return code, ring.tail(5)
    code, tail = run(go())
    assert code == 3 and "hello" in tail and "oops" in tail
    assert describe_status(3) == "exit status 3"
    assert describe_status(-9) == "killed by signal 9 (SIGKILL)"


def test_own_process_group_and_env_and_cwd(tmp_path):
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", "import os; print(os.getpgid(0), os.getsid(0), os.getcwd(), os.environ['HLF_X'])"],
                      {"HLF_X": "42"}, str(tmp_path), ring)
        await child.exited
        await asyncio.sleep(0.1)
        return child.pid, ring.tail(1)[0].split()
    pid, (pgid, sid, cwd, x) = run(go())
    assert int(pgid) == pid == int(sid) and cwd == str(tmp_path) and x == "42"


def test_stop_is_one_sigterm_then_sigkill_after_the_timeout():
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", STUBBORN], {}, None, ring)
        while "up" not in ring.lines:  # a whole line: a partial one may be cut by the SIGTERM handler's print
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        code = await child.stop(0.5)
        await asyncio.sleep(0.1)
        return code, time.monotonic() - t0, ring.tail(10)
    code, took, tail = run(go())
    assert code == -signal.SIGKILL and took >= 0.5
    assert tail.count("SIGTERM 1") == 1 and "SIGTERM 2" not in tail


def test_a_cooperative_child_exits_on_the_sigterm():
    async def go():
        child = await Child.start(["sleep", "30"], {}, None, LogRing())
        return await child.stop(5)
    assert run(go()) == -signal.SIGTERM


def test_what_the_server_forked_goes_with_it():
    async def go():
        ring = LogRing()
        child = await Child.start(["sh", "-c", "sleep 30 & echo $!; wait"], {}, None, ring)
        while not ring.tail(1):
            await asyncio.sleep(0.02)
        grandchild = int(ring.tail(1)[0])
        await child.stop(5)
        return grandchild
    grandchild = run(go())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_the_child_dies_with_its_parent_even_on_sigkill(tmp_path):
    # a parent process that spawns a Child and then is SIGKILLed: the child must not survive it
    pidfile = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import asyncio, sys
        from homelab_frontend.lifecycle.process import Child
        from homelab_frontend.lifecycle.logring import LogRing
        async def main():
            c = await Child.start(["sleep", "60"], {{}}, None, LogRing())
            open({str(pidfile)!r}, "w").write(str(c.pid))
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        pid = int(pidfile.read_text())
        assert _alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_missing_program_raises_at_spawn():
    async def go():
        try:
            await Child.start(["/nonexistent/llama-server"], {}, None, LogRing())
        except OSError as err:
            return err
    assert isinstance(run(go()), FileNotFoundError)


def test_the_fleets_spawn_leaves_the_event_loop_running_while_the_supervisor_starts():
    """The supervisor's start (an interpreter, a fork, the server's exec: 60-100 ms on a loaded
    2-core machine, measured) is waited for off the event loop: every stream the gateway relays
    meanwhile goes on. Judged by a ticker task that must run during the spawn, not by time."""
    from homelab_frontend.lifecycle.effects import spawn_child

    async def go():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        child = await spawn_child(["sleep", "30"], {}, None, LogRing(), 5.0)
        during = ticks - before
        task.cancel()
        assert child.running and _alive(child.pid)
        assert await child.stop(5) == -signal.SIGTERM
        return during

    assert run(go()) > 1


def test_a_missing_program_raises_at_the_fleets_spawn():
    from homelab_frontend.lifecycle.effects import spawn_child

    async def go():
        try:
            await spawn_child(["/nonexistent/llama-server"], {}, None, LogRing(), 5.0)
        except OSError as err:
            return err
    assert isinstance(run(go()), FileNotFoundError)


def test_a_start_cancelled_while_the_supervisor_launches_leaves_no_server_behind():
    """The launch goes on in its thread after the caller left (a fleet closed mid-start): what it
    started is let go of, and its supervisor takes the whole tree down, the server's own child
    included (a SIGKILL of the supervisor would leave that one to init). asyncio.run returns once
    the launch's thread is done; from then on nothing with the test's marker may stay."""
    marker = f"61.{time.time_ns() % 10**9}"

    def ours() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if marker.encode() in f.read():
                            found.append(int(entry))
                except OSError:
                    pass
        return [p for p in found if p != os.getpid() and _alive(p)]

    async def go():
        task = asyncio.create_task(Child.start(["sh", "-c", f"sleep {marker} & wait"], {}, None, LogRing()))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
    run(go())
    deadline = time.monotonic() + 30
    while left := ours():
        assert time.monotonic() < deadline, f"the abandoned launch lives on: {left}"
        time.sleep(0.05)
