"""The process supervisor between the gateway and one managed server: no process of the server's
tree outlives the gateway, however the gateway dies.

Run as a script, never imported by the gateway: `python -I -S supervisor.py [--grace S] -- cmd
args...` (`process.Child` does it; `--grace` is the backend's `run.kill_grace_s`, DEATH_GRACE_S
without it). Standard library only, and with `-I -S` the interpreter reads neither
site-packages nor PYTHON* variables, so the user's environment for the server (a vLLM venv's
PYTHONPATH, say) cannot break it and it starts in tens of milliseconds. Its file descriptors:

- 0, the control pipe from the gateway. Lines `term` (one SIGTERM to the server's process group;
  a second `term` is ignored: llama-server that gets a second SIGTERM during its shutdown hangs
  until SIGKILL) and `kill` (SIGKILL of the whole tree). **End of file means the gateway is gone**
  (it exited or was killed, SIGKILL included: the kernel closes a dead process's descriptors):
  one SIGTERM to every process of the tree, SIGKILL of what is left after the grace, exit.
  Signals to the supervisor itself are ignored: its life is the pipe's.
- 1, the status pipe to the gateway: `pid N` once the server is exec'd (or `error ERRNO` if it
  could not be), `note TEXT` for the server's log, and last `exit N` with the server's own status
  (negative: the signal), so the gateway still says `exit status 1` or `killed by signal 9`.
- 2, the server's log pipe: the server gets it as its stdout and stderr (and /dev/null as stdin).

The server is the supervisor's child, in a session and process group of its own (a Ctrl-C in the
gateway's terminal reaches the gateway only; a graceful stop signals the group). Whenever the
server's process ends, what is left of its tree is killed before `exit` is reported, so a stopped
backend leaves nothing behind that holds its port or its memory. During a stop, though, the
other members of the server's group got the SIGTERM too and may finish their shutdown first (a
wrapper shell dies at once, the server it started takes its time) until the gateway's `kill`.

Why a subreaper and a pipe:
- `PR_SET_CHILD_SUBREAPER` makes every orphan of the tree (a wrapper script's background server,
  a daemon that double-forks, a process that calls setsid: vLLM's EngineCore and workers, the
  multiprocessing resource tracker) re-parented to the supervisor instead of to init. So "the
  tree" is exactly the supervisor's descendants, found by walking /proc's parent links (this
  kernel may lack /proc/PID/task/TID/children) and killed round after round until none is left,
  each reaped. A process cannot leave the tree by forking, setsid or a new process group; only a
  process started by somebody else (a container started by the Docker daemon) is outside it.
- The pipe is the one death notice that needs nothing of the dying process: the kernel closes
  its descriptors whatever killed it, and it is tied to no thread (a parent-death signal fires
  when the *thread* that forked ends, which an asyncio gateway that forks from a worker thread,
  or a test runner, can make happen at any time).
- A parent-death signal on the direct child alone (what the gateway did before) kills the `cmd`
  process only: what it forked lives on, re-parented to init (vLLM's engine: gigabytes of memory
  and all of a GPU's). And setting it needs code between fork and exec in the gateway
  (`preexec_fn`), which can deadlock in a process that runs threads, as Python's docs warn. The
  supervisor does set one on the server, from its own single thread: should the supervisor itself
  be SIGKILLed, the server at least goes with it.
- A cgroup per server (cgroup v2's `cgroup.kill`) would also be escape-proof and would account
  the server's memory, but it needs a delegated, writable cgroup tree (root, or systemd's
  `Delegate=`; a container's /sys/fs/cgroup is often read-only, and these machines run cgroup v1
  controllers), and still somebody alive to write `cgroup.kill` when the gateway dies: a watcher
  like this one, or systemd itself. Under systemd the unit's cgroup is a second line that
  composes with the supervisor (with `KillMode=mixed`, which the docs advise: the default
  SIGTERMs the servers under the gateway's drain, systemd SIGKILLs what is left when the stop
  times out); without systemd the supervisor needs no privilege and works on any Linux >= 3.4.
- A graceful stop keeps the gateway's semantics: one SIGTERM to the server's group, and the
  gateway sends `kill` after `stop_timeout_s`. On the gateway's death every process of the tree
  gets one SIGTERM (none gets a second: the group is skipped if a stop already signalled it),
  then SIGKILL after the grace (`run.kill_grace_s`, 5 s by default). SIGKILL at once would free the port a little sooner,
  but vLLM then leaves its shared memory behind: 400 MB of /dev/shm per engine, measured, which
  nothing reclaims until reboot. Given the SIGTERM, vLLM shuts down and multiprocessing's
  resource tracker (which ignores SIGTERM) unlinks what is left once its clients are gone: 2.7 s
  for the CPU build on 2 busy cores, measured; 2 s were too few.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_GIVE_UP_S = 30.0  # a process in uninterruptible sleep may take long to die; not forever
KILL_ROUND_S = 0.02
GROUP_POLL_S = 0.05
# On the gateway's death, what the tree may take to clean up after one SIGTERM before SIGKILL:
# vLLM's processes unlink their shared memory (hundreds of MB in /dev/shm, which SIGKILL leaves
# behind) and multiprocessing's resource tracker cleans what they could not.
DEATH_GRACE_S = 5.0

CTL, STATUS, LOG = 0, 1, 2


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None off Linux (ctypes is loaded here only: the gateway never imports this)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError, ImportError):
        return None


# -- the tree, by /proc ------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, str, int, int] | None:
    """(ppid, state, process group, starttime) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0].decode(), int(fields[2]), int(fields[19])


def descendants(root: int) -> dict[int, tuple[str, int, int]]:
    """Every process below `root` by parent links: pid -> (state, process group, starttime)."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is None:
            continue
        ppid, state, pgrp, start = st
        children.setdefault(ppid, []).append(int(entry))
        info[int(entry)] = (state, pgrp, start)
    out: dict[int, tuple[str, int, int]] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in out or pid not in info:
            continue
        out[pid] = info[pid]
        todo.extend(children.get(pid, ()))
    return out


def _kill_exact(pid: int, start: int, sig: int) -> None:
    """Signal the process that had this pid and start time, never one that reused the pid since:
    a pidfd pins the process, then its start time is checked again."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): the plain kill's tiny race
        st = _stat(pid)
        if st is not None and st[3] == start:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return
    try:
        st = _stat(pid)
        if st is not None and st[3] == start:
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


# -- the supervisor ----------------------------------------------------------------------------

class Supervisor:
    def __init__(self, argv: list[str], grace_s: float = DEATH_GRACE_S) -> None:
        self.argv = argv
        self.grace_s = grace_s
        self.me = os.getpid()
        self.server = 0
        self.status: int | None = None  # the server's, as subprocess says it (negative: signal)
        self.term_sent = False
        self.gateway_gone = False
        self.killed: set[tuple[int, int]] = set()  # (pid, start time) of what it killed besides the server
        self.prctl = _prctl()

    def send(self, line: str) -> None:
        try:
            os.write(STATUS, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        except OSError:  # the gateway is gone: the control pipe's end of file says so next
            pass

    def note(self, text: str) -> None:
        self.send(f"note -- gateway: supervisor: {text}")

    # -- starting ------------------------------------------------------------------------------

    def become_subreaper(self) -> None:
        if self.prctl is None or self.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            self.note("cannot become the child subreaper: what the server's processes orphan escapes the tree")

    def spawn(self) -> int | None:
        """Fork and exec the server; its pid, or None with `error ERRNO` sent."""
        err_r, err_w = os.pipe()  # close-on-exec: end of file means the exec succeeded
        devnull = os.open(os.devnull, os.O_RDONLY)
        pid = os.fork()
        if pid == 0:  # the server-to-be: this process has one thread, so anything goes here
            try:
                os.setsid()
                if self.prctl is not None:
                    self.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() != self.me:  # the supervisor died before the prctl took effect
                    os._exit(1)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; exec keeps that
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                os.dup2(devnull, 0)
                os.dup2(LOG, 1)
                os.execvp(self.argv[0], self.argv)
            except OSError as exc:
                os.write(err_w, str(exc.errno or 0).encode())
            except BaseException:
                os.write(err_w, b"0")
            os._exit(127)
        os.close(err_w)
        os.close(devnull)
        chunks = []
        while True:
            chunk = os.read(err_r, 64)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(err_r)
        if chunks:
            os.waitpid(pid, 0)
            self.send(f"error {int(b''.join(chunks) or b'0')}")
            return None
        self.server = pid
        self.send(f"pid {pid}")
        return pid

    # -- ending --------------------------------------------------------------------------------

    def reap(self) -> bool:
        """Reap every exited child (orphans of the tree come here); False once none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.server and self.status is None:
                self.status = os.waitstatus_to_exitcode(status)

    def signal_group(self, sig: int) -> None:
        # the server's group id is its pid, which cannot be reused while we have not reaped it
        if self.server and self.status is None:
            try:
                os.killpg(self.server, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_tree(self) -> None:
        """SIGKILL every process below the supervisor, round after round until none is left, each
        reaped."""
        give_up = time.monotonic() + KILL_GIVE_UP_S
        while True:
            self.signal_group(signal.SIGKILL)
            live = {pid: start for pid, (state, _, start) in descendants(self.me).items() if state not in ("Z", "X")}
            for pid, start in live.items():
                _kill_exact(pid, start, signal.SIGKILL)
                if pid != self.server:
                    self.killed.add((pid, start))
            if not self.reap() and not live:
                return
            if time.monotonic() > give_up:
                self.note(f"gave up after {KILL_GIVE_UP_S:g} s: still alive: {sorted(live)}")
                return
            time.sleep(KILL_ROUND_S)

    def group_alive(self) -> bool:
        """Some process of the server's group still runs: during a stop they got the SIGTERM
        with it, and may finish their shutdown (a wrapper shell dies at once; the server it
        started, in its group, takes its time) until the gateway's `kill`."""
        return any(pgrp == self.server and state not in ("Z", "X")
                   for state, pgrp, _ in descendants(self.me).values())

    def wind_down(self) -> None:
        """The gateway is gone: one SIGTERM to every process of the tree that has not had one (the
        server's group, unless a stop sent it already, and those outside it), then up to the
        grace for them to exit; `kill_tree` follows."""
        outside = {pid: start for pid, (state, pgrp, start) in descendants(self.me).items()
                   if state not in ("Z", "X") and pgrp != self.server}
        if not self.term_sent:
            self.term_sent = True
            self.signal_group(signal.SIGTERM)
        for pid, start in outside.items():  # a stop signals the group only: these had none
            _kill_exact(pid, start, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            self.reap()
            if not any(state not in ("Z", "X") for state, _, _ in descendants(self.me).values()):
                return
            time.sleep(GROUP_POLL_S)

    def on_control(self, data: bytes) -> None:
        for word in data.decode("ascii", "replace").split():
            if word == "term" and not self.term_sent:
                self.term_sent = True
                self.signal_group(signal.SIGTERM)
            elif word == "kill":
                self.kill_tree()

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
        # Its life is the pipe's: a signal to it is ignored (caught, so that exec resets it for
        # the server). systemd's stop SIGTERMs every process of the unit's cgroup at once; the
        # gateway must still drain its requests on servers that run, then stop them itself.
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: None)
        self.become_subreaper()
        try:
            if self.spawn() is None:
                return 0
            while not self.gateway_gone:
                if self.status is not None and not (self.term_sent and self.group_alive()):
                    break
                # a stopping group's members are not our children: their exits wake nobody here
                wait_s = 1.0 if self.status is None else GROUP_POLL_S
                ready, _, _ = select.select([CTL, wake_r], [], [], wait_s)
                if wake_r in ready:
                    os.read(wake_r, 512)
                if CTL in ready:
                    data = os.read(CTL, 512)
                    if not data:
                        self.gateway_gone = True
                    else:
                        self.on_control(data)
                self.reap()
            if self.gateway_gone:
                self.wind_down()
        finally:
            self.kill_tree()  # whatever ended the loop: nothing of the tree stays
        if self.killed and not self.gateway_gone:
            self.note(f"killed {len(self.killed)} process(es) the server left behind")
        self.send(f"exit {self.status if self.status is not None else -signal.SIGKILL}")
        return 0


def main(args: list[str]) -> int:
    grace_s = DEATH_GRACE_S
    if args[:1] == ["--grace"]:
        try:
            grace_s = float(args[1])
        except (IndexError, ValueError):
            grace_s = -1.0
        args = args[2:]
    if len(args) < 2 or args[0] != "--" or not grace_s >= 0:
        sys.stderr.write("usage: supervisor.py [--grace SECONDS] -- cmd [args...]\n")
        return 2
    return Supervisor(args[1:], grace_s).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
