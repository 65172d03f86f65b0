"""The process supervisor (lifecycle/supervisor.py) with real process trees: a server that forks,
a child that calls setsid, a daemon that double-forks. Judged by /proc (tests/proctree.py): when
the gateway's pipe closes, or the gateway is SIGKILLed, no process of the tree is left within a
few seconds; a graceful stop is exactly one SIGTERM; the server's own exit status is reported.

What ignores the one SIGTERM on the gateway's death is killed after the grace: the tests that are
not about the grace run with a short one (`--grace`, a backend's `run.kill_grace_s`), and one of
them proves the default."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from homelab_frontend.lifecycle.logring import LogRing
from homelab_frontend.lifecycle.process import SUPERVISOR, Child
from homelab_frontend.lifecycle.supervisor import DEATH_GRACE_S
from proctree import cmdline, start_time, survivors, tree, wait_all_gone
from stubproc import wait_for

# "within a few seconds": what ignores the one SIGTERM is killed after the grace; the figures
# printed are what it took
GONE_WITHIN_S = DEATH_GRACE_S + 5.0
SHORT_GRACE_S = 0.3

# The server: records every process of its tree in a file, as "tag pid". Besides itself, a plain
# child (in its process group, ignoring SIGTERM), a child in a session of its own, and a daemon
# (setsid, double fork: orphaned at once, ignoring SIGTERM). Then it counts the SIGTERMs it gets;
# `stubborn` never exits on them, `cooperative` exits 0 on the first, `exit3` exits 3 at once.
TREE = textwrap.dedent("""
    import os, signal, sys, time
    out, mode = sys.argv[1], sys.argv[2]
    def record(tag):
        with open(out, "a") as f:
            f.write(f"{tag} {os.getpid()}\\n")
    def forever():
        while True:
            time.sleep(60)
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN); record("child"); forever()
    if os.fork() == 0:
        os.setsid(); record("setsid"); forever()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN); record("daemon"); forever()
        os._exit(0)
    n = 0
    def on_term(*_):
        global n
        n += 1
        print(f"SIGTERM {n}", flush=True)
        if mode == "cooperative":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while not os.path.exists(out) or sum(1 for _ in open(out)) < 3:
        time.sleep(0.01)
    record("server")
    print("up", flush=True)
    if mode == "exit3":
        sys.exit(3)
    forever()
""")


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path):
    """Should the supervisor fail, the test's tree still goes (other helpers share the machine)."""
    yield
    try:
        lines = (tmp_path / "tree").read_text().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        pid = int(line.split()[1])
        if str(tmp_path) in cmdline(pid):  # that very tree's process (its argv names the file)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def recorded(path, n: int = 4, timeout: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        if len(lines) >= n:
            return {tag: int(pid) for tag, pid in (line.split() for line in lines)}
        assert time.monotonic() < deadline, f"the tree did not come up: {lines}"
        time.sleep(0.02)


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def supervise(tmp_path, mode: str, grace_s: float | None = SHORT_GRACE_S) -> tuple[subprocess.Popen, int, dict[str, int]]:
    """The supervisor run as the gateway runs it, its pipes held by the test (the server's log
    in tmp_path/log); `grace_s` None: without `--grace`, the default."""
    out = tmp_path / "tree"
    grace = [] if grace_s is None else ["--grace", str(grace_s)]
    with open(tmp_path / "log", "wb") as log:
        sup = subprocess.Popen([sys.executable, "-I", "-S", SUPERVISOR, *grace, "--", sys.executable, "-c", TREE, str(out), mode],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    line = sup.stdout.readline().decode()
    assert line.startswith("pid "), line
    return sup, int(line.split()[1]), recorded(out)


def test_the_pipe_closing_kills_the_whole_tree_setsid_and_double_fork_included(tmp_path):
    sup, server, pids = supervise(tmp_path, "stubborn")
    try:
        assert pids["server"] == server
        # the subreaper at work: the double-forked daemon's parent is the supervisor, not init
        assert ppid(pids["daemon"]) == sup.pid
        procs = tree(sup.pid)
        assert set(pids.values()) <= set(procs) and len(procs) == 4 and survivors(procs) == sorted(procs)
        sup.stdin.close()  # what the kernel does when the gateway dies
        took = wait_all_gone(procs, GONE_WITHIN_S)
        assert sup.wait(GONE_WITHIN_S) == 0
        print(f"tree of {len(procs)} gone {took:.3f} s after the pipe closed")
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_a_gateway_killed_by_sigkill_leaves_no_process_of_the_tree(tmp_path):
    # a gateway-like parent: an event loop (and a thread, as the real gateway has) spawning a Child
    out = tmp_path / "tree"
    script = textwrap.dedent(f"""
        import asyncio, sys, threading
        from homelab_frontend.lifecycle.process import Child
        from homelab_frontend.lifecycle.logring import LogRing
        async def main():
            threading.Thread(target=lambda: __import__("time").sleep(600), daemon=True).start()
            await Child.start([sys.executable, "-c", {TREE!r}, {str(out)!r}, "stubborn"], {{}}, None, LogRing(),
                              {SHORT_GRACE_S!r})
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        pids = recorded(out)
        procs = tree(parent.pid)
        assert set(pids.values()) <= set(procs) and len(procs) == 5  # the supervisor and the four
        assert survivors(procs) == sorted(procs)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        took = wait_all_gone(procs, GONE_WITHIN_S)
        print(f"tree of {len(procs)} gone {took:.3f} s after the gateway's SIGKILL")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_graceful_stop_is_exactly_one_sigterm_then_sigkill_of_the_tree(tmp_path):
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", TREE, str(tmp_path / "tree"), "stubborn"], {}, None, ring)
        pids = await asyncio.to_thread(recorded, tmp_path / "tree")
        procs = tree(os.getpid())
        procs = {p: s for p, s in procs.items() if p in pids.values() or p == child.pid}
        while "up" not in ring.lines:  # a whole line: a partial one may be cut by the SIGTERM handler's print
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        codes = await asyncio.gather(child.stop(1.0), child.stop(1.0))  # two stops: still one SIGTERM
        took = time.monotonic() - t0
        left = survivors(procs)  # at once: `exited` means the tree is gone
        await asyncio.sleep(0.1)
        return codes, took, left, ring.tail(20), child.pid, pids
    codes, took, left, tail, pid, pids = asyncio.run(go())
    assert pid == pids["server"]
    assert codes == [-signal.SIGKILL] * 2 and took >= 1.0
    assert left == []
    assert tail.count("SIGTERM 1") == 1 and not any(line.startswith("SIGTERM 2") for line in tail), tail
    assert any("no exit 1 s after SIGTERM: SIGKILL" in line for line in tail)


def test_a_cooperative_server_exits_on_the_sigterm_its_group_gets_the_stop_timeout(tmp_path):
    # the server exits 0 on the SIGTERM; its child in its group ignores it, and has until the
    # stop timeout to finish; then it and what left the group are killed
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", TREE, str(tmp_path / "tree"), "cooperative"], {}, None, ring)
        pids = await asyncio.to_thread(recorded, tmp_path / "tree")
        procs = {p: start_time(p) for p in pids.values()}
        while "up" not in ring.lines:  # a whole line: a partial one may be cut by the SIGTERM handler's print
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        code = await child.stop(2)
        took = time.monotonic() - t0
        left = survivors(procs)
        await asyncio.sleep(0.1)
        return code, took, left, ring.tail(20)
    code, took, left, tail = asyncio.run(go())
    assert code == 0 and left == []  # its own status: it exited 0 on the SIGTERM
    assert took >= 2 and "-- gateway: no exit 2 s after SIGTERM: SIGKILL" in tail
    assert tail.count("SIGTERM 1") == 1
    assert "-- gateway: supervisor: killed 3 process(es) the server left behind" in tail


def test_during_a_stop_the_servers_group_may_finish_before_the_rest_is_killed(tmp_path):
    # a wrapper shell dies at once on the SIGTERM; the server it started (in its group) takes a
    # moment to shut down and is not cut short; the daemon outside the group is killed
    out = tmp_path / "tree"
    script = textwrap.dedent(f"""
        {sys.executable} -c 'import signal, sys, time
        def bye(*_):
            time.sleep(0.5); print("server: clean shutdown", flush=True); sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("server up", flush=True)
        while True: time.sleep(1)' &
        ( setsid sleep 3600 & echo "daemon $!" >> {out} )
        echo "server $!" >> {out}
        wait
    """)

    async def go():
        ring = LogRing()
        child = await Child.start(["/bin/sh", "-c", script], {}, None, ring)
        pids = await asyncio.to_thread(recorded, out, 2)
        procs = {p: start_time(p) for p in pids.values()}
        # the daemon leaves the server's group only once setsid has run in it, which a busy
        # machine delays: stopped before that, the group's SIGTERM takes it and nothing is left
        while "server up" not in ring.lines or os.getsid(pids["daemon"]) != pids["daemon"]:
            await asyncio.sleep(0.02)
        code = await child.stop(10)
        left = survivors(procs)
        await asyncio.sleep(0.1)
        return code, left, ring.tail(20)
    code, left, tail = asyncio.run(go())
    assert code == -signal.SIGTERM and left == []  # sh's own status
    assert "server: clean shutdown" in tail and not any("no exit" in line for line in tail)
    assert "-- gateway: supervisor: killed 1 process(es) the server left behind" in tail


def test_the_servers_own_exit_status_is_reported_and_its_leftovers_go(tmp_path):
    async def go():
        ring = LogRing()
        child = await Child.start([sys.executable, "-c", TREE, str(tmp_path / "tree"), "exit3"], {}, None, ring)
        code = await child.exited
        pids = {p: start_time(p) for p in recorded(tmp_path / "tree").values()}
        return code, survivors({p: s for p, s in pids.items() if s is not None})
    code, left = asyncio.run(go())
    assert code == 3 and left == []


def test_a_server_killed_from_outside_is_reported_as_killed_by_that_signal():
    async def go():
        child = await Child.start(["sleep", "60"], {}, None, LogRing())
        os.kill(child.pid, signal.SIGKILL)
        return await child.exited
    assert asyncio.run(go()) == -signal.SIGKILL


def test_a_supervisor_killed_by_sigkill_takes_the_server_with_it():
    # not the gateway dying: the supervisor itself, which should never happen; the server's
    # parent-death signal still ends it, and the gateway says what it knows
    async def go():
        ring = LogRing()
        child = await Child.start(["sleep", "60"], {}, None, ring)
        server = {child.pid: start_time(child.pid)}
        os.kill(child._sup.pid, signal.SIGKILL)
        code = await child.exited
        took = await asyncio.to_thread(wait_all_gone, server, GONE_WITHIN_S)
        return code, took, ring.tail(3)
    code, _, tail = asyncio.run(go())
    assert code == -signal.SIGKILL
    assert any("the process supervisor ended without the server's status" in line for line in tail)


def test_a_program_that_cannot_run_raises_as_popen_does(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")

    async def go(argv):
        try:
            await Child.start(argv, {}, None, LogRing())
        except OSError as err:
            return err
    missing = asyncio.run(go(["no-such-program-hlf"]))
    assert isinstance(missing, FileNotFoundError) and missing.filename == "no-such-program-hlf"
    assert isinstance(asyncio.run(go([str(script)])), PermissionError)
    # and PATH is the server's environment's, as Popen reads it
    async def from_path():
        child = await Child.start(["hlf-here"], {"PATH": str(tmp_path)}, None, LogRing())
        return await child.exited
    (tmp_path / "hlf-here").write_text("#!/bin/sh\nexit 7\n")
    (tmp_path / "hlf-here").chmod(0o755)
    assert asyncio.run(from_path()) == 7


@pytest.mark.parametrize("word", ["kill", ""])
def test_the_supervisor_answers_kill_and_end_of_file_alike(tmp_path, word):
    sup, server, pids = supervise(tmp_path, "stubborn")
    try:
        procs = tree(sup.pid)
        if word:
            sup.stdin.write(word.encode() + b"\n")
            sup.stdin.flush()
        else:
            sup.stdin.close()
        wait_all_gone(procs, GONE_WITHIN_S)
        rest = sup.stdout.read().decode().split("\n")
        assert sup.wait(GONE_WITHIN_S) == 0
        assert f"exit {-signal.SIGKILL}" in rest
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_signals_to_the_supervisor_are_ignored_its_life_is_the_pipes(tmp_path):
    # systemd's stop SIGTERMs every process of the unit's cgroup: the servers must still run while
    # the gateway drains, and go when it says so (or dies)
    sup, server, pids = supervise(tmp_path, "stubborn")
    try:
        procs = tree(sup.pid)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            sup.send_signal(sig)
        time.sleep(0.5)
        assert sup.poll() is None and survivors(procs) == sorted(procs)
        sup.stdin.close()
        wait_all_gone(procs, GONE_WITHIN_S)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


# the default grace once (what a backend without `run.kill_grace_s` gets), a short one given by
# `--grace` once
@pytest.mark.parametrize("stopping, grace_s", [(False, None), (True, SHORT_GRACE_S)])
def test_on_the_gateways_death_each_process_gets_one_sigterm_then_sigkill(tmp_path, stopping, grace_s):
    # one SIGTERM lets a server clean up (vLLM's shared memory); never a second, even when the
    # gateway dies during a stop that sent one; what ignores it is killed after the grace
    sup, server, pids = supervise(tmp_path, "stubborn", grace_s)
    try:
        procs = tree(sup.pid)
        log = tmp_path / "log"
        if stopping:
            sup.stdin.write(b"term\n")
            sup.stdin.flush()
            wait_for(lambda: "SIGTERM 1" in log.read_text(), 10)
        t0 = time.monotonic()
        sup.stdin.close()
        wait_all_gone(procs, GONE_WITHIN_S)
        took = time.monotonic() - t0
        lines = log.read_text().splitlines()
        assert lines.count("SIGTERM 1") == 1 and "SIGTERM 2" not in lines, lines
        # the child and the daemon ignore it: killed after the grace, and not the default's when
        # it was given (4.7 s to spare: no timing assumption on a busy machine)
        assert took >= (DEATH_GRACE_S if grace_s is None else grace_s) - 0.1
        if grace_s is not None:
            assert took < DEATH_GRACE_S, took
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_a_pid_is_signalled_only_while_it_names_the_same_process():
    # the tree is walked, then signalled: a pid that was reused meanwhile (another start time)
    # must not be hit
    from homelab_frontend.lifecycle.supervisor import _kill_exact, descendants
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = start_time(victim.pid)
        assert descendants(os.getpid())[victim.pid][2] == start
        _kill_exact(victim.pid, start + 1, signal.SIGKILL)  # another process's start time
        time.sleep(0.2)
        assert victim.poll() is None
        _kill_exact(victim.pid, start, signal.SIGKILL)
        assert victim.wait(5) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
