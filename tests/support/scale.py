"""How many examples a property test with its own count runs: `make test` runs the count as
written, `make test-fast` a quarter of it (HLF_HYPOTHESIS_SCALE=0.25, the Makefile's FAST_ENV),
and HLF_HYPOTHESIS_SCALE=10 runs a deeper search locally. A test that sets no count gets the
fast profile's 25 in the fast set (tests/conftest.py)."""

from __future__ import annotations

import os


def examples(n: int) -> int:
    return max(1, int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1"))))
