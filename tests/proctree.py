"""A process tree judged by /proc: every process below a pid, and whether any of them still runs.

Processes are named by (pid, start time), so a pid reused by an unrelated process after the tree
died is never taken for a survivor. Only the tree the test started is looked at: other helpers'
servers run on this machine."""

from __future__ import annotations

import os
import signal
import time


def _stat(pid: int) -> tuple[int, str, int, int] | None:
    """(ppid, state, pgrp, start time) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0].decode(), int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return None if st is None else st[3]


def tree(root: int, *, include_root: bool = False) -> dict[int, int]:
    """Every live process below `root` (by parent links): pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[1] not in ("Z", "X"):
            children.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[3]
    out: dict[int, int] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = starts[pid]
            todo.extend(children.get(pid, ()))
    if include_root and (s := start_time(root)) is not None:
        out[root] = s
    return out


def running(pid: int, start: int) -> bool:
    """That very process still runs: some thread of it is not a zombie (a multi-threaded server's
    main thread shows as a zombie while its other threads, which hold its sockets, still exit)."""
    st = _stat(pid)
    if st is None or st[3] != start:
        return False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    for tid in tasks:
        t = _stat_task(pid, tid)
        if t not in (None, "Z", "X"):
            return True
    return False


def _stat_task(pid: int, tid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def survivors(procs: dict[int, int]) -> list[int]:
    return sorted(pid for pid, start in procs.items() if running(pid, start))


def kill_all(procs: dict[int, int]) -> None:
    """SIGKILL whatever of `procs` still runs: should the supervisor under test fail, the test's
    processes still go (the machine is shared)."""
    for pid in survivors(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_all_gone(procs: dict[int, int], timeout: float) -> float:
    """Seconds until none of `procs` runs; AssertionError naming the survivors after `timeout`."""
    t0 = time.monotonic()
    while left := survivors(procs):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"still running after {timeout:g} s: {[(p, cmdline(p)) for p in left]}")
        time.sleep(0.02)
    return time.monotonic() - t0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def shm_of(procs: dict[int, int]) -> set[str]:
    """The /dev/shm files the processes map (POSIX shared memory, semaphores): what a process
    killed without its cleanup leaves in memory until reboot."""
    out = set()
    for pid in procs:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
                    if path.startswith("/dev/shm/"):
                        out.add(path.removesuffix(" (deleted)"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return out
