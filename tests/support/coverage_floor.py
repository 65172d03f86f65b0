"""The line-coverage floor `make test` holds: `python tests/support/coverage_floor.py`.

Run after the suite under coverage and `coverage combine` ([tool.coverage] in pyproject.toml: the
pytest workers and every gateway, stub and CLI process the tests started). Every product module
(each .py of src/homelab_frontend) has FLOOR of its lines run, or a stated reason in REASONS for
why not and where its behaviour is tested instead. Prints the total and every module under the
floor; exits 1 when one has no reason, or a reason names no module.

A script after pytest rather than a pytest hook: the data is whole only once every process has
ended (the xdist workers and the gateways they stopped write theirs at exit, after the
controller's session hooks), and `make test-fast`, which does not measure, needs no hook to skip.

A reason whose module has reached the floor is reported as stale but does not fail the run: a
module near the floor can cross it either way with which timing-dependent paths a busy machine
took; remove the reason when it is seen stale.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG_DIR = ROOT / "src" / "homelab_frontend"
FLOOR = 80.0

# module (dotted) -> why it is under the floor, and where its behaviour is tested instead
REASONS: dict[str, str] = {
    "homelab_frontend.lifecycle.supervisor": (
        "runs as `python -I -S supervisor.py` between the gateway and its server: no site, so no "
        "coverage .pth (and nothing else of the environment) starts there, by design; "
        "tests/unit/lifecycle/test_supervisor.py and tests/integration/test_supervised.py drive it as "
        "that process and judge it by the process tree"),
}


@dataclass(frozen=True)
class Covered:
    module: str
    statements: int
    missing: int

    @property
    def percent(self) -> float:
        return 100.0 if self.statements == 0 else 100.0 * (self.statements - self.missing) / self.statements


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def measure() -> list[Covered]:
    """Every product module's statements and missed lines from the combined data (a module no
    process imported counts with every line missed)."""
    import coverage

    cov = coverage.Coverage(config_file=str(ROOT / "pyproject.toml"), data_file=str(ROOT / ".coverage-data" / "coverage"))
    cov.load()
    out = []
    for path in sorted(PKG_DIR.rglob("*.py")):
        _, statements, _, missing, _ = cov.analysis2(str(path))
        out.append(Covered(module_name(path), len(statements), len(missing)))
    return out


def judge(covered: list[Covered], reasons: dict[str, str], floor: float = FLOOR) -> tuple[list[str], list[str]]:
    """(failures, notes): a module under the floor without a reason, a reason naming no module,
    an empty reason fail; a reason whose module reached the floor is a note."""
    known = {c.module for c in covered}
    failures, notes = [], []
    for name in sorted(set(reasons) - known):
        failures.append(f"{name}: has a reason in REASONS but no such module (remove it)")
    for c in covered:
        reason = reasons.get(c.module)
        if reason is not None and not reason.strip():
            failures.append(f"{c.module}: an empty reason")
        elif c.percent < floor and reason is None:
            failures.append(f"{c.module}: {c.percent:.0f}% of {c.statements} lines, under {floor:.0f}% "
                            "with no reason (a test, or a reason in tests/support/coverage_floor.py)")
        elif c.percent >= floor and reason is not None:
            notes.append(f"{c.module}: {c.percent:.0f}%, at the floor now: its reason is stale")
    return failures, notes


def total_percent(covered: list[Covered]) -> float:
    statements = sum(c.statements for c in covered)
    missing = sum(c.missing for c in covered)
    return 100.0 if statements == 0 else 100.0 * (statements - missing) / statements


def main() -> int:
    covered = measure()
    failures, notes = judge(covered, REASONS)
    print(f"line coverage: {total_percent(covered):.1f}% of {sum(c.statements for c in covered)} lines "
          f"in {len(covered)} modules; under {FLOOR:.0f}%:")
    for c in sorted(covered, key=lambda c: c.percent):
        if c.percent < FLOOR:
            print(f"  {c.percent:3.0f}% {c.module}: {REASONS.get(c.module, 'NO REASON')}")
    for n in notes:
        print("  note:", n)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
