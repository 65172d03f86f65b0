"""tests/support/coverage_floor.py, the line-coverage floor `make test` holds after the run: a
module under 80% fails without a stated reason and passes with one, a reason must name a module
and say something, a reason whose module reached the floor is reported as stale; and the table
of reasons in the file holds those rules against the modules that exist."""

from __future__ import annotations

from support import coverage_floor as cf
from support.coverage_floor import Covered, judge


def test_a_module_under_the_floor_fails_without_a_reason_and_passes_with_one():
    covered = [Covered("homelab_frontend.a", 100, 30), Covered("homelab_frontend.b", 100, 20)]
    failures, notes = judge(covered, {})
    assert len(failures) == 1 and failures[0].startswith("homelab_frontend.a: 70% of 100 lines, under 80%")
    assert judge(covered, {"homelab_frontend.a": "its server is started by tests/real only"}) == ([], [])


def test_a_reason_must_name_a_module_and_say_something():
    covered = [Covered("homelab_frontend.a", 10, 9)]
    failures, _ = judge(covered, {"homelab_frontend.a": "  ", "homelab_frontend.gone": "was moved"})
    assert failures == ["homelab_frontend.gone: has a reason in REASONS but no such module (remove it)",
                        "homelab_frontend.a: an empty reason"]


def test_a_reason_whose_module_reached_the_floor_is_stale_but_does_not_fail():
    failures, notes = judge([Covered("homelab_frontend.a", 10, 2)], {"homelab_frontend.a": "timing"})
    assert failures == [] and notes == ["homelab_frontend.a: 80%, at the floor now: its reason is stale"]


def test_a_module_without_statements_is_covered_and_the_total_weighs_by_lines():
    assert Covered("homelab_frontend.empty", 0, 0).percent == 100.0
    assert cf.total_percent([Covered("a", 90, 0), Covered("b", 10, 10)]) == 90.0


def test_module_names_are_the_dotted_import_names():
    assert cf.module_name(cf.PKG_DIR / "app" / "serve.py") == "homelab_frontend.app.serve"
    assert cf.module_name(cf.PKG_DIR / "app" / "__init__.py") == "homelab_frontend.app"


def test_every_stated_reason_names_a_module_that_exists_and_says_why():
    modules = {cf.module_name(p) for p in cf.PKG_DIR.rglob("*.py")}
    for name, reason in cf.REASONS.items():
        assert name in modules, f"{name}: no such module (remove its reason)"
        assert len(reason.split()) >= 4, f"{name}: say why, and where its behaviour is tested instead"
