"""Where a pinned npm CLI of .ci/deps is: the install script says (`SCRIPT --bin [VERSION]`), so
the e2e tests do not rebuild a cache path the script owns."""

from __future__ import annotations

import subprocess
from pathlib import Path


def cli_bin(installer: Path, *version: str) -> Path:
    done = subprocess.run(["bash", str(installer), "--bin", *version], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())
