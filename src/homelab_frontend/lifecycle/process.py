"""One child process of the gateway: spawned so that it cannot outlive the gateway, stopped
the one way llama-server tolerates.

- Its own session and process group (`start_new_session`): a Ctrl-C in the gateway's terminal
  reaches the gateway only, which drains and then stops its children itself; and a stop
  signals the whole group, so helper processes a server forks go with it.
- `PR_SET_PDEATHSIG = SIGKILL`, set in the child between fork and exec: when the gateway dies,
  even by SIGKILL, the kernel kills the child. The signal is tied to the *thread* that forked,
  so children are spawned from the event loop's thread only (never from a worker thread that
  may end). A parent that died between fork and prctl is caught by re-checking the parent pid.
  Only the direct child gets it: a `cmd` that is a wrapper script forking the server leaves a
  grandchild on a gateway SIGKILL (the README says: exec the server, `exec llama-server ...`).
- Stop is one SIGTERM, then SIGKILL after `stop_timeout_s`. Never a second SIGTERM: llama-server
  that gets one shortly into its shutdown prints "Received second interrupt, terminating
  immediately." and then hangs until SIGKILL.
- stdout and stderr go to a bounded `LogRing`, read by the event loop as they come (the child
  never blocks on a full pipe). Exit is noticed through a pidfd (Linux >= 5.3), else by polling.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
from typing import Mapping

from .logring import LogRing

PR_SET_PDEATHSIG = 1
POLL_S = 0.1  # exit polling where pidfd_open is missing

_libc = None


def _pdeathsig(parent: int) -> None:
    """preexec_fn: runs in the child, after setsid, before exec. Async-signal-safe calls only."""
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the gateway died before the prctl took effect
        os._exit(1)


def _load_libc() -> None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.prctl  # noqa: B018 (raises AttributeError off Linux)
        except (OSError, AttributeError):
            _libc = None


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


class Child:
    """A spawned server. `exited` resolves with its return code (negative: the signal)."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: str | None, ring: LogRing) -> None:
        _load_libc()
        loop = asyncio.get_running_loop()
        self.ring = ring
        read_fd, write_fd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, cwd=cwd,
                env={**os.environ, **env}, start_new_session=True, close_fds=True,
                preexec_fn=lambda parent=os.getpid(): _pdeathsig(parent),
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.pid = self.proc.pid
        self.exited: asyncio.Future[int] = loop.create_future()
        self._transport = None
        self._pipe = os.fdopen(read_fd, "rb", buffering=0)
        self._reader = loop.create_task(self._connect(loop))  # kept: a task only weakly held may vanish
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
            loop.add_reader(self._pidfd, self._reap)
        except (AttributeError, OSError):
            self._pidfd = None
            loop.call_later(POLL_S, self._poll)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._transport, _ = await loop.connect_read_pipe(lambda: _Pump(self.ring), self._pipe)
        except (OSError, ValueError):
            self._pipe.close()

    def _poll(self) -> None:
        if self.proc.poll() is None:
            asyncio.get_running_loop().call_later(POLL_S, self._poll)
        else:
            self._done()

    def _reap(self) -> None:
        if self.proc.poll() is not None:
            self._done()

    def _done(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        # the group may hold what the server forked: it goes too (the leader is reaped, so the
        # group id cannot have been reused while any member lives)
        self._signal_group(signal.SIGKILL)
        if not self.exited.done():
            self.exited.set_result(self.proc.returncode)

    @property
    def running(self) -> bool:
        return not self.exited.done()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def stop(self, timeout_s: float) -> int:
        """One SIGTERM to the group, SIGKILL after `timeout_s`; returns once it has exited."""
        if self.running:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), timeout_s)
            except TimeoutError:
                self.ring.mark(f"-- gateway: no exit {timeout_s:g} s after SIGTERM: SIGKILL")
                self._signal_group(signal.SIGKILL)
        return await self.exited

    def kill(self) -> None:
        """Synchronous SIGKILL of the group (the last resort at interpreter exit)."""
        if self.running:
            self._signal_group(signal.SIGKILL)

    def close_pipe(self) -> None:
        if self._transport is not None:
            self._transport.close()
