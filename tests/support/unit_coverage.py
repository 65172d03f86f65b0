"""Which product modules have unit tests: `python tests/support/unit_coverage.py`.

A product module is every module of src/homelab_frontend except package `__init__`s and
`__main__`; it counts as covered when a test under tests/unit imports it (by name, or its
package with the module as the imported name). Prints the share and the modules without one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "homelab_frontend"


def product_modules() -> set[str]:
    base = ROOT / "src" / PKG
    out = set()
    for p in base.rglob("*.py"):
        if p.name in ("__init__.py", "__main__.py"):
            continue
        out.add(PKG + "." + ".".join(p.relative_to(base).with_suffix("").parts))
    return out


def imported_by_unit_tests(modules: set[str]) -> set[str]:
    seen = set()
    for p in (ROOT / "tests" / "unit").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG):
                seen.add(node.module)
                seen.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                seen.update(a.name for a in node.names)
    return seen & modules


def main() -> int:
    mods = product_modules()
    covered = imported_by_unit_tests(mods)
    print(f"{len(covered)}/{len(mods)} product modules have unit tests ({100 * len(covered) / len(mods):.0f}%)")
    for m in sorted(mods - covered):
        print("  none:", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
