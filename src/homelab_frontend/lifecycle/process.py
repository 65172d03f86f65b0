"""One managed server of the gateway, run under its own process supervisor (`supervisor.py`, whose
docstring is the design note) so that no process of the server's tree outlives the gateway,
however the gateway dies, and stopped the one way llama-server tolerates.

- The gateway spawns `python -I -S supervisor.py -- cmd...` in a session of its own (no
  `preexec_fn`: nothing of the gateway's runs between fork and exec, which can deadlock in a
  process with threads) and holds the write end of its control pipe. The supervisor is the tree's
  child subreaper; when that pipe closes (the gateway died, SIGKILL included) it kills the whole
  tree. The server itself runs in a session and process group of its own below it.
- `pid` is the server's (the supervisor reports it as soon as the exec succeeded; `Child.start`
  waits for that, as `subprocess.Popen` waits for its exec: a missing program raises `OSError`
  there; the wait runs in a thread, so the event loop relays meanwhile).
- Stop is one SIGTERM to the server's group, then SIGKILL of the whole tree after
  `stop_timeout_s`. Never a second SIGTERM: llama-server that gets one shortly into its shutdown
  prints "Received second interrupt, terminating immediately." and then hangs until SIGKILL.
- `exited` resolves with the server's own status (negative: the signal) once the supervisor has
  killed what the server left behind and exited, so the port and memory are free by then.
- stdout and stderr go to a bounded `LogRing`, read by the event loop as they come (the child
  never blocks on a full pipe); the supervisor's own remarks are marked in it as the gateway's.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, NamedTuple

from .logring import LogRing

SUPERVISOR = str(Path(__file__).with_name("supervisor.py"))
SPAWN_TIMEOUT_S = 60.0  # the supervisor's own start: tens of ms; minutes only on a machine on its knees
POLL_S = 0.1  # exit polling where pidfd_open is missing
ABANDON_WAIT_S = 30.0  # a supervisor let go of kills its tree first (its grace for a SIGTERM: 5 s by default)


def describe_status(code: int) -> str:
    """A wait status as the issue's 503 says it: `exit status 1`, `killed by signal 9 (SIGKILL)`."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "?"
        return f"killed by signal {-code} ({name})"
    return f"exit status {code}"


class _Pump(asyncio.Protocol):
    def __init__(self, ring: LogRing) -> None:
        self.ring = ring

    def data_received(self, data: bytes) -> None:
        self.ring.feed(data)

    def eof_received(self) -> bool:
        self.ring.close()
        return False


class _Status(asyncio.Protocol):
    """The supervisor's status lines after `pid`: `note TEXT`, `exit N`; then end of file."""

    def __init__(self, child: "Child", pending: bytes) -> None:
        self.child = child
        self.buf = bytearray(pending)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._lines()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._lines()

    def _lines(self) -> None:
        while (nl := self.buf.find(b"\n")) >= 0:
            line = self.buf[:nl].decode("utf-8", "replace")
            del self.buf[:nl + 1]
            self.child._status_line(line)

    def eof_received(self) -> bool:
        self.child._status_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.child._status_eof()


def _read_line(fd: int, timeout_s: float) -> tuple[str | None, bytes]:
    """The first line from a blocking pipe (None at end of file), and what came after it."""
    buf = bytearray()
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"the process supervisor did not start within {timeout_s:g} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            return None, bytes(buf)
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    return line.decode("utf-8", "replace"), rest


class _Launched(NamedTuple):
    """A supervisor that has reported the server's pid, and the gateway's ends of its pipes."""

    sup: subprocess.Popen[bytes]
    ctl_w: int
    st_r: int
    log_r: int
    pid: int
    rest: bytes  # what the supervisor said after its `pid` line


def _launch(argv: list[str], env: Mapping[str, str], cwd: str | None, kill_grace_s: float | None) -> _Launched:
    """Start the supervisor and wait for its first word: blocking (an interpreter's start, a fork,
    the server's exec: tens of ms, hundreds on a loaded machine), so run off the event loop."""
    grace = [] if kill_grace_s is None else ["--grace", repr(float(kill_grace_s))]
    ctl_r, ctl_w = os.pipe()
    st_r, st_w = os.pipe()
    log_r, log_w = os.pipe()
    try:
        sup = subprocess.Popen(
            [sys.executable, "-I", "-S", SUPERVISOR, *grace, "--", *argv],
            stdin=ctl_r, stdout=st_w, stderr=log_w, cwd=cwd, env={**os.environ, **env},
            start_new_session=True, close_fds=True,
        )
    except BaseException:
        for fd in (ctl_w, st_r, log_r):
            os.close(fd)
        raise
    finally:
        for fd in (ctl_r, st_w, log_w):
            os.close(fd)
    try:
        line, rest = _read_line(st_r, SPAWN_TIMEOUT_S)
        word, _, value = (line or "").partition(" ")
        if word == "error":  # the exec failed: raised as Popen raises it
            sup.wait()
            err = int(value)
            raise OSError(err, os.strerror(err), argv[0])
        if word != "pid":
            sup.kill()
            raise RuntimeError(f"the process supervisor failed ({describe_status(sup.wait())})")
    except BaseException:
        for fd in (ctl_w, st_r, log_r):  # the control pipe's end: the supervisor kills the tree
            os.close(fd)
        try:
            sup.wait(ABANDON_WAIT_S)
        except subprocess.TimeoutExpired:  # a supervisor that does not even do that: the last resort
            sup.kill()
            sup.wait()
        raise
    return _Launched(sup, ctl_w, st_r, log_r, int(value), rest)


def _abandon_launched(fut: "asyncio.Future[_Launched]") -> None:
    """Let go of what a cancelled `Child.start` launched: the end of its control pipe makes the
    supervisor kill the tree (not a SIGKILL of the supervisor, which would leave the server's
    own children to init); it is reaped in a thread."""
    if fut.cancelled() or fut.exception() is not None:
        return
    got = fut.result()
    for fd in (got.ctl_w, got.st_r, got.log_r):
        os.close(fd)
    try:
        asyncio.get_running_loop().run_in_executor(None, got.sup.wait)
    except RuntimeError:  # the loop is shutting down: Popen reaps it at the next spawn, or at exit
        pass


class Child:
    """A spawned server. `exited` resolves with its return code (negative: the signal). Made by
    `await Child.start(argv, env, cwd, ring)`."""

    @classmethod
    async def start(cls, argv: list[str], env: Mapping[str, str], cwd: str | None, ring: LogRing,
                    kill_grace_s: float | None = None) -> "Child":
        """Spawn `argv` under its supervisor; returns once the server is exec'd (a program that
        cannot run raises `OSError`, as Popen does). The wait runs in a thread: the event loop
        relays every other request meanwhile. `kill_grace_s`: should the gateway die, how long
        the tree has after its one SIGTERM before SIGKILL (None: the supervisor's own 5 s)."""
        if not argv:
            raise ValueError("empty command")
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, _launch, list(argv), env, cwd, kill_grace_s)
        try:
            launched = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # the launch goes on in its thread: whatever it starts is let go of at once
            fut.add_done_callback(_abandon_launched)
            raise
        return cls(launched, ring)

    def __init__(self, launched: _Launched, ring: LogRing) -> None:
        loop = asyncio.get_running_loop()
        self.ring = ring
        self._sup = launched.sup
        self._ctl: int | None = launched.ctl_w
        self.pid = launched.pid
        self.exited: asyncio.Future[int] = loop.create_future()
        self._status: int | None = None
        self._status_done = False
        self._sup_done = False
        self._term_sent = False
        self._transports: list[asyncio.BaseTransport] = []
        self._st_pipe = os.fdopen(launched.st_r, "rb", buffering=0)
        self._log_pipe = os.fdopen(launched.log_r, "rb", buffering=0)
        rest = launched.rest
        # kept: a task only weakly held may vanish
        self._readers = [loop.create_task(self._connect(loop, self._log_pipe, lambda: _Pump(self.ring))),
                         loop.create_task(self._connect(loop, self._st_pipe, lambda: _Status(self, rest)))]
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self._sup.pid)
            loop.add_reader(self._pidfd, self._reap)
        except (AttributeError, OSError):
            self._pidfd = None
            loop.call_later(POLL_S, self._poll)

    async def _connect(self, loop: asyncio.AbstractEventLoop, pipe: BinaryIO,
                       protocol: Callable[[], asyncio.BaseProtocol]) -> None:
        try:
            transport, _ = await loop.connect_read_pipe(protocol, pipe)
            self._transports.append(transport)
        except (OSError, ValueError):
            pipe.close()
            if pipe is self._st_pipe:
                self._status_eof()

    # -- what the supervisor says ---------------------------------------------------------------

    def _status_line(self, line: str) -> None:
        word, _, value = line.partition(" ")
        if word == "exit":
            self._status = int(value)
        elif word == "note":
            self.ring.mark(value)

    def _status_eof(self) -> None:
        self._status_done = True
        self._maybe_done()

    def _poll(self) -> None:
        if self._sup.poll() is None:
            asyncio.get_running_loop().call_later(POLL_S, self._poll)
        else:
            self._reaped()

    def _reap(self) -> None:
        if self._sup.poll() is not None:
            self._reaped()

    def _reaped(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._sup_done = True
        self._maybe_done()

    def _maybe_done(self) -> None:
        # both: the supervisor has exited (so the tree is gone) and its last word has been read
        if not (self._sup_done and self._status_done) or self.exited.done():
            return
        code = self._status
        if code is None:  # it died without a word (someone killed it): its own status, said so
            code = self._sup.returncode
            self.ring.mark(f"-- gateway: the process supervisor ended without the server's status "
                           f"({describe_status(code)})")
        self._close_ctl()
        self.exited.set_result(code)

    # -- what the gateway says ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def _send(self, word: str) -> None:
        if self._ctl is not None:
            try:
                os.write(self._ctl, word.encode() + b"\n")
            except OSError:  # the supervisor is gone already
                pass

    def _close_ctl(self) -> None:
        if self._ctl is not None:
            os.close(self._ctl)
            self._ctl = None

    async def stop(self, timeout_s: float) -> int:
        """One SIGTERM to the server's group, SIGKILL of its tree after `timeout_s`; returns once
        it has exited (and nothing of its tree is left)."""
        if self.running:
            if not self._term_sent:
                self._term_sent = True
                self._send("term")
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), timeout_s)
            except TimeoutError:
                self.ring.mark(f"-- gateway: no exit {timeout_s:g} s after SIGTERM: SIGKILL")
                self._send("kill")
        return await self.exited

    def kill(self) -> None:
        """SIGKILL of the whole tree, without waiting (the last resort, e.g. at interpreter exit)."""
        if self.running:
            self._send("kill")

    def close_pipe(self) -> None:
        for transport in self._transports:
            transport.close()
        self._close_ctl()  # the supervisor reads this as the gateway's end: the tree goes
