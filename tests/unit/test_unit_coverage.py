"""tests/support/unit_coverage.py's GLUE list stays true: each module in it exists, has no unit
test (else it is no exception), and says in its own docstring that it is glue; and every other
product module has a unit test."""

from __future__ import annotations

import importlib

from support import unit_coverage


def test_every_glue_module_exists_says_so_and_has_no_unit_test():
    mods = unit_coverage.product_modules()
    covered = unit_coverage.imported_by_unit_tests(mods)
    for name in unit_coverage.GLUE:
        assert name in mods, f"{name}: no such module (remove it from GLUE)"
        assert name not in covered, f"{name} has a unit test now: remove it from GLUE"
        doc = importlib.import_module(name).__doc__ or ""
        assert "glue" in doc.lower(), f"{name}: its docstring should say it is only glue, and why"


def test_every_product_module_has_a_unit_test_or_is_glue():
    """135 of 135 when this was written: a new module comes with its unit test, or goes in GLUE
    with where its behaviour is tested instead."""
    mods = unit_coverage.product_modules()
    covered = unit_coverage.imported_by_unit_tests(mods)
    assert sorted(mods - covered - set(unit_coverage.GLUE)) == []
