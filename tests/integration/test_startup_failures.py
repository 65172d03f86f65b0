"""Start-up failures: a taken port, a config that cannot be read or does not validate. Each is one
line on stderr naming the problem, and exit status 2: no traceback, no "Unclosed client session"."""

from __future__ import annotations

import socket
import subprocess
import sys

import yaml

from gwproc import config_for


def _config(tmp_path, **extra) -> str:
    cfg = config_for({"gpu0": "http://127.0.0.1:9/v1"}, {"m": {"backend": "gpu0"}},
                     responses={"store": {"path": str(tmp_path / "responses.sqlite3")}},
                     **{"usage": {"path": str(tmp_path / "usage.sqlite3")}, **extra})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "homelab_frontend", "serve", *args],
                          capture_output=True, text=True, timeout=30)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Unclosed" not in err
    return lines[0]


def test_taken_port_is_one_line_and_exit_2(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        done = _serve("--config", _config(tmp_path), "--host", "127.0.0.1", "--port", str(port))
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line == f"homelab-frontend: cannot listen on 127.0.0.1:{port}: address already in use", line
    assert "listening on" not in done.stdout


def test_unreadable_config_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nope.yaml"
    done = _serve("--config", str(missing), "--port", "0")
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line.startswith("homelab-frontend: invalid config: ") and str(missing) in line, line
    assert "cannot read" in line, line


def test_invalid_config_is_one_line_naming_every_problem(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "backends": {"gpu0": {"url": "http://127.0.0.1:9/v1", "slots": 0}},
        "models": {"m": {"backend": "gpu9"}},
    }))
    done = _serve("--config", str(path), "--port", "0")
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line.startswith("homelab-frontend: invalid config: "), line
    assert "backends.gpu0.slots" in line and "models.m.backend" in line, line


def test_a_ledger_it_cannot_write_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "afile").write_text("")
    done = _serve("--config", _config(tmp_path, usage={"path": str(tmp_path / "afile" / "usage.sqlite3")}), "--port", "0")
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line.startswith("homelab-frontend: invalid config: usage.path: cannot create"), line
