"""tests/support/unit_coverage.py's GLUE list stays true: each module in it exists, has no unit
test (else it is no exception), and says in its own docstring that it is glue."""

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
