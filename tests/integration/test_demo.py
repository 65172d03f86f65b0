"""`homelab-frontend demo` as a user runs it (the console script, a process): it keeps its config,
usage ledger and stored Responses in a throwaway directory, never the user's own state, and removes
it however it ends (SIGTERM, Ctrl-C, a failed start); a second demo that cannot have the port
fails before touching the first one's stub log. The stubs it started are gone when it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.childproc import START_GUARD_S, wait_listening
from managed import alive, wait_gone
from rawhttp import post_raw
from stubproc import free_port, wait_for

CLI = str(Path(sys.executable).with_name("homelab-frontend"))


@pytest.fixture
def where(tmp_path):
    """TMPDIR (where the demo's directory goes), XDG_STATE_HOME (the user's real state), the logs."""
    dirs = {name: tmp_path / name for name in ("tmp", "state", "logs")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def start(where, port: int) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(where["tmp"]), "XDG_STATE_HOME": str(where["state"]),
           "HLF_DEMO_LOG_DIR": str(where["logs"])}
    return subprocess.Popen([CLI, "demo", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def demo_dirs(where) -> list[Path]:
    return sorted(where["tmp"].glob("homelab-frontend-demo-*"))


def stub_pids(demo: subprocess.Popen) -> list[int]:
    with open(f"/proc/{demo.pid}/task/{demo.pid}/children") as f:
        return [int(p) for p in f.read().split()]


def finish(demo: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        demo.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)
        demo.wait()
        raise
    err = demo.stderr.read().decode(errors="replace")
    demo.stdout.close()
    demo.stderr.close()
    return demo.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_demo_keeps_its_state_to_itself_and_removes_it_when_stopped(where, sig):
    demo = start(where, free_port())
    try:
        url = wait_listening(demo, START_GUARD_S)
        assert url, "the demo did not start"
        [own] = demo_dirs(where)
        stubs = stub_pids(demo)
        assert len(stubs) == 2 and all(alive(p) for p in stubs)
        status, _, raw = post_raw(url + "/llm/v1/responses", {"model": "reasoning", "input": "hi", "store": True})
        assert status == 200, raw
        rid = json.loads(raw)["id"]
        status, _, _ = post_raw(url + "/llm/v1/chat/completions",
                                {"model": "qwen2.5:3b-instruct", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
        assert get(url + f"/llm/v1/responses/{rid}") == 200  # stored, and where: the user's state is empty below
        wait_for(lambda: (own / "usage.sqlite3").exists(), 10)  # the ledger's writer runs off the loop
        assert {"config.yaml", "usage.sqlite3", "responses.sqlite3"} <= {p.name for p in own.iterdir()}
        demo.send_signal(sig)
        status, err = finish(demo)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert status == 0, err
    assert demo_dirs(where) == []  # removed
    assert list(where["state"].iterdir()) == []  # the user's own ledger and store never touched
    for pid in stubs:
        wait_gone(pid)


def test_a_second_demo_that_cannot_bind_leaves_the_first_ones_log_and_no_directory(where):
    port = free_port()
    first = start(where, port)
    try:
        url = wait_listening(first, START_GUARD_S)
        assert url, "the first demo did not start"
        status, _, _ = post_raw(url + "/llm/v1/chat/completions",
                                {"model": "reasoning", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
        log = where["logs"] / "stub-reasoning.log"
        before = log.read_text()
        assert before  # the first demo's stub logged its request
        second = start(where, port)
        status, err = finish(second)
        assert status == 2
        assert err.strip() == f"homelab-frontend: cannot listen on 127.0.0.1:{port}: address already in use"
        assert log.read_text() == before  # not truncated
        assert len(demo_dirs(where)) == 1  # the first one's only
        first.send_signal(signal.SIGINT)
        assert finish(first)[0] == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert demo_dirs(where) == []


def test_a_failed_start_removes_the_directory_and_says_why(where):
    demo = subprocess.Popen([CLI, "demo", "--port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(where["tmp"]), "XDG_STATE_HOME": str(where["state"]),
                                 "HLF_DEMO_LOG_DIR": str(where["logs"] / "missing")})
    status, err = finish(demo)
    assert status == 2
    assert err.strip() == f"demo: cannot write {where['logs'] / 'missing' / 'stub-reasoning.log'}: No such file or directory"
    assert demo_dirs(where) == [] and list(where["state"].iterdir()) == []
