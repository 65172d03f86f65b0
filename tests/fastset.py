"""`make test-fast`: the unit and stub-backed tests, without real model servers, CLIs or browsers.

A test is left out of the fast set by the `real` mark (`-m "not real"`): every test under tests/real/
and tests/e2e/ has it (tests/conftest.py adds it by path); a test elsewhere that drives a real
server, a CLI or a browser says so with `pytestmark = pytest.mark.real`.

Forgetting the mark cannot go unnoticed: in the fast set (HLF_TEST_FAST=1, set by `make test-fast`)
an audit hook refuses, while a test runs, every process it starts that is a real server, a CLI or
a browser (anything .ci/deps installs into its caches, node, chromium, another Python than this
one), and the test fails saying which mark it lacks. Stubs, gateways and the demo (this Python),
shells, curl and redis-server are fine.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ENV = "HLF_TEST_FAST"
# what the fast set may not start: anything .ci/deps installs into its caches (llama-server and its
# model, vLLM's venv, the npm CLIs), node, the browser and its driver, and any Python that is not
# this one (vLLM's venv). A program that does not exist is let through to fail as it would.
ROOT = Path(__file__).resolve().parents[1]
CACHES = (Path.home() / ".cache" / "homelab-frontend", ROOT / ".cache")
SLOW_NAMES = {"llama-server", "node", "npm", "npx", "chromium", "chromedriver", "claude", "codex", "gemini", "vllm",
              "whisper-server", "sd-server", "espeak-ng", "nginx", "caddy"}


_armed = False  # only while a test runs (setup, call, teardown): pytest and xdist start processes of their own


def active() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _refuse_slow_processes(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _armed:
        return
    executable, argv = args[0], args[1]
    first = executable or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
    name = os.fsdecode(first) if first is not None else ""
    found = shutil.which(name)
    if found is None:
        return  # fails to start on its own (a test of exactly that)
    path = Path(os.path.realpath(found))
    if path == Path(os.path.realpath(sys.executable)):
        return
    slow = (path.name in SLOW_NAMES or Path(name).name in SLOW_NAMES
            or any(path.is_relative_to(c) or Path(found).is_relative_to(c) for c in CACHES)
            or path.name.startswith("python"))
    if slow:
        raise RuntimeError(
            f"`make test-fast` runs no real server, CLI or browser, and this test starts {name!r}: "
            "mark it `pytest.mark.real` (or put it under tests/real/ or tests/e2e/)"
        )


def install() -> None:
    sys.addaudithook(_refuse_slow_processes)


class Guard:
    """A pytest plugin: arms the audit hook for the length of each test."""

    import pytest as _pytest

    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        global _armed
        _armed = True
        try:
            yield
        finally:
            _armed = False
