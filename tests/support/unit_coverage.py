"""Which product modules have unit tests: `python tests/support/unit_coverage.py`.

A product module is every module of src/homelab_frontend except package `__init__`s and
`__main__`; it counts as covered when a test under tests/unit imports it (by name, or its
package with the module as the imported name). Prints the share and the modules without one.

GLUE lists the modules that are only glue, each with where its behaviour is tested instead: they
wire tested parts together (a handler over the skeleton, a launcher of processes) and hold no
decision a unit test could check without sockets or processes. Each says so in its docstring."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "homelab_frontend"

GLUE = {
    "homelab_frontend.app.demo": "starts two stubs and a gateway: tests/integration/test_seed_verify.py runs it as a user would",
    "homelab_frontend.surfaces.responses.state": "makes the sealer and the store (both unit-tested) for the gateway",
}


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
    glue = {m for m in GLUE if m in mods} - covered
    print(f"{len(covered)}/{len(mods)} product modules have unit tests ({100 * len(covered) / len(mods):.0f}%), "
          f"{len(glue)} are glue")
    for m in sorted(glue):
        print("  glue:", m, "-", GLUE[m])
    for m in sorted(mods - covered - glue):
        print("  none:", m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
