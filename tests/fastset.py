"""`make test-fast`: the unit and stub-backed tests, without real model servers, CLIs or browsers.

A test is left out of the fast set by the `real` mark (`-m "not real"`): every test under tests/real/
and tests/e2e/ has it (tests/conftest.py adds it by path); a test elsewhere that drives a real
server, a CLI or a browser says so with `pytestmark = pytest.mark.real`.

Forgetting the mark cannot go unnoticed: in the fast set (HLF_TEST_FAST=1, set by `make test-fast`)
an audit hook refuses every process a test starts that is not this Python (stubs, gateways, the
demo), a shell, curl or redis-server, and the test fails saying which mark it lacks.
"""

from __future__ import annotations

import os
import sys

ENV = "HLF_TEST_FAST"
# what a fast test may start: the interpreter running the tests (stubs, gateways), a shell for the
# seeds' curl commands, curl, and redis-server (starts in milliseconds; the cluster tests' store)
ALLOWED = {"bash", "sh", "curl", "redis-server"}


def active() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _refuse_slow_processes(event: str, args: tuple) -> None:
    if event != "subprocess.Popen":
        return
    executable, argv = args[0], args[1]
    first = executable or (argv[0] if isinstance(argv, (list, tuple)) and argv else argv)
    path = os.fsdecode(first) if first is not None else ""
    if os.path.realpath(path) == os.path.realpath(sys.executable) or path == sys.executable:
        return
    if os.path.basename(path) in ALLOWED:
        return
    raise RuntimeError(
        f"`make test-fast` runs no real server, CLI or browser, and this test starts {path!r}: "
        "mark it `pytest.mark.real` (or put it under tests/real/ or tests/e2e/)"
    )


def install() -> None:
    sys.addaudithook(_refuse_slow_processes)
