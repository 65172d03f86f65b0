"""A dependency the tests need that pip does not install (a llama.cpp build, vLLM's venv, a model).

Missing in CI (CI=true) it is a broken setup, so the test fails with the instruction that gets it;
elsewhere the test is skipped with it."""

from __future__ import annotations

import os

import pytest


def require(why: str | None) -> None:
    """Nothing when `why` is None (all there), else fail in CI or skip with `why`."""
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)
